"""The node's certificate: obtained by joining with a token on the first start, reused after a restart, and
renewed well before it expires. Kept in <state-dir>/tls (the key 0600); the key never leaves the node."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import grpc

from tfcluster import layout
from tfcluster import pki
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.leaders import Coordinators, leader_hint
from tfcluster.security import Credentials, fetch_ca

log = logging.getLogger("tfcluster.agent")

JOIN_TIMEOUT_SECONDS = 20.0
# A node may start before the coordinator, or with hundreds of others behind one address (joins are rate-limited
# per source): such refusals are waited out, for this long at most, instead of ending the agent.
JOIN_PATIENCE_SECONDS = 600.0
JOIN_RETRY_MAX_SECONDS = 10.0
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED)


class JoinError(Exception):
    """The node could not get its certificate; the message says why and what to do."""


class LeaderElsewhere(ConnectionError):
    """A standby coordinator's join port refused the join and named the leader's."""

    def __init__(self, why: str, error: grpc.RpcError):
        super().__init__(why)
        self.error = error


class NodeIdentity:
    """The node's credentials on disk, and how to get and renew them."""

    def __init__(self, state_dir: Path, name: str, address: str):
        self.dir = layout.tls_dir(state_dir)
        self.name, self.address = name, address

    def load(self) -> Credentials | None:
        """The stored credentials (None: the node never joined). A node that joined never joins again by itself:
        a certificate that cannot be used (it expired while the agent was off, another CA) is an admin's call,
        not a reason to spend a join token left in the agent's settings."""
        if not (self.dir / pki.NODE_CERT).exists():
            return None
        try:
            ca = pki.Authority(pki.load_cert(self.dir / pki.CA_CERT))
            cert = pki.load_cert(self.dir / pki.NODE_CERT)
            ca.verify(cert)
            pki.check_key_matches(self.dir / pki.NODE_KEY, cert)
        except pki.PkiError as e:
            raise JoinError(f"the node's certificate cannot be used: {e}. An admin lets the node back in: "
                            f"`tfcluster token create --node {self.name}` on an admin's host; put that token in "
                            f"the agent's join token file and move {self.dir} away") from None
        who = pki.identity(cert)
        if who.role != pki.NODE or who.name != self.name:
            raise JoinError(f"{self.dir / pki.NODE_CERT} is the certificate of {who}, not of node {self.name!r}; "
                            f"keep the node's --name, or remove {self.dir} and join again")
        return Credentials.from_dir(self.dir, pki.NODE_CERT, pki.NODE_KEY)

    def join(self, join_address: str, token: str, ca_cert: bytes | None = None, ca_hash: str = "",
             patience: float = JOIN_PATIENCE_SECONDS) -> Credentials:
        """Trades the join token for a certificate. The coordinator is verified with the CA given (a file),
        or the one its join port presents whose public key has the pinned hash. A coordinator that is not up
        yet, or asks to slow down, is tried again for `patience` seconds. join_address may name several
        coordinators' join ports (HOST:PORT,HOST:PORT): a standby names the leader's, which is tried at once."""
        give_up, wait = time.monotonic() + patience, 1.0
        coordinators = Coordinators(join_address)
        while True:
            try:
                return self._join_once(coordinators.current, token, ca_cert, ca_hash)
            except LeaderElsewhere as e:
                coordinators.failed(e.error)
                log.info("%s; joining through %s", e, coordinators.current)
                time.sleep(0.1)  # at once, yet never a busy loop between coordinators that disagree
                continue
            except ConnectionError as e:
                if time.monotonic() + wait > give_up:
                    raise JoinError(f"{e}; gave up after {patience:.0f} s") from None
                log.warning("%s; retrying in %.0f s", e, wait)
                coordinators.failed()
            time.sleep(wait)
            wait = min(wait * 2, JOIN_RETRY_MAX_SECONDS)

    def _join_once(self, join_address: str, token: str, ca_cert: bytes | None, ca_hash: str) -> Credentials:
        """One try; raises ConnectionError when trying again may help, JoinError when it will not."""
        try:
            ca = ca_cert or fetch_ca(join_address, ca_hash)
        except pki.PkiError as e:
            raise JoinError(str(e)) from None
        key, csr = pki.new_csr(self.name)
        # Only the coordinator's certificate will do: another of the same CA (a node's) cannot take the token.
        channel = grpc.secure_channel(join_address, grpc.ssl_channel_credentials(root_certificates=ca),
                                      options=[("grpc.ssl_target_name_override", pki.COORDINATOR_NAME)])
        try:
            reply = agent_pb2_grpc.JoinServiceStub(channel).Join(
                agent_pb2.JoinRequest(token=token, node_name=self.name, csr=csr), timeout=JOIN_TIMEOUT_SECONDS)
        except grpc.RpcError as e:
            why = f"joining through {join_address} failed: {e.details() or e.code().name}"
            if leader_hint(e) and leader_hint(e) != join_address:
                raise LeaderElsewhere(why, e) from None
            raise (ConnectionError if e.code() in RETRIED else JoinError)(why) from None
        finally:
            channel.close()
        # The CA this node trusts is the one it was given or pinned, never what the answer says it is.
        self._save(key, reply.certificate, ca)
        log.info("joined the cluster through %s as node %s", join_address, self.name)
        return Credentials.from_dir(self.dir, pki.NODE_CERT, pki.NODE_KEY)

    def renew(self, channel: grpc.Channel) -> Credentials:
        """A new certificate for a new key, asked for with the current one (raises grpc.RpcError)."""
        key, csr = pki.new_csr(self.name)
        reply = agent_pb2_grpc.AgentServiceStub(channel).RenewCertificate(
            agent_pb2.RenewCertificateRequest(csr=csr), timeout=JOIN_TIMEOUT_SECONDS)
        self._save(key, reply.certificate, (self.dir / pki.CA_CERT).read_bytes())
        log.info("renewed the node's certificate")
        return Credentials.from_dir(self.dir, pki.NODE_CERT, pki.NODE_KEY)

    def renew_at(self) -> float:
        """When to renew: about two thirds into the certificate's life."""
        cert = pki.load_cert(self.dir / pki.NODE_CERT)
        start, end = cert.not_valid_before_utc + pki.BACKDATE, cert.not_valid_after_utc
        return (start + (end - start) * pki.RENEW_AT).timestamp()

    def expires_at(self) -> float:
        return pki.load_cert(self.dir / pki.NODE_CERT).not_valid_after_utc.timestamp()

    def _save(self, key: bytes, cert: bytes, ca: bytes) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        pki.write_private(self.dir / pki.NODE_KEY, key)
        (self.dir / pki.CA_CERT).write_bytes(ca)
        (self.dir / pki.NODE_CERT).write_bytes(cert)

