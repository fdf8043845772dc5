"""A party's credentials (its certificate and key, and the cluster's CA) and the channels made with them.

Light on purpose: what every client command needs (reading a credentials directory, a channel that accepts only
the coordinator) imports grpc and nothing of the CA's cryptography, which only the daemons and `tfcluster ca` use
(pki.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from tfcluster import auth

# Files of a credentials directory (`--tls-dir`, TFCLUSTER_TLS_DIR, an agent's <state>/tls).
CA_CERT, CA_KEY = "ca.crt", "ca.key"
CLIENT_CERT, CLIENT_KEY = "client.crt", "client.key"
SERVER_CERT, SERVER_KEY = "coordinator.crt", "coordinator.key"
NODE_CERT, NODE_KEY = "node.crt", "node.key"
# The names a client checks a server's certificate against (gRPC's target name), whatever address it dials:
# only a coordinator's certificate carries COORDINATOR_NAME, only node N's carries server_name(N). The CA puts
# them in itself, never from a request, so no other certificate of the cluster can stand in for these servers.
# `.invalid` never resolves: these names exist in certificates only.
COORDINATOR_NAME = "coordinator.tfcluster.invalid"
NODE_NAME_SUFFIX = ".node.tfcluster.invalid"


def node_server_name(node: str) -> str:
    """The name only node `node`'s certificate carries: what a peer checks when it sends that node files."""
    return f"{node}{NODE_NAME_SUFFIX}"


class PkiError(ValueError):
    """A credential that is missing, unreadable or not what it must be; the message says which."""


@dataclass(frozen=True)
class Credentials:
    """A certificate and its key, and the CA that signed the other side's; or none at all (--insecure), where
    a shared cluster token, if any, is what keeps strangers out."""
    ca: bytes = b""
    cert: bytes = b""
    key: bytes = b""
    token: str | None = None

    @property
    def insecure(self) -> bool:
        return not self.ca

    @classmethod
    def from_dir(cls, directory: Path, cert: str = CLIENT_CERT, key: str = CLIENT_KEY) -> "Credentials":
        files = [directory / CA_CERT, directory / cert, directory / key]
        try:
            return cls(*(f.read_bytes() for f in files))
        except OSError as e:
            raise PkiError(f"{e.filename}: cannot read: {e.strerror or e}") from None

    def server(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=True)

    def join_server(self) -> grpc.ServerCredentials:
        """The join port: the server proves who it is (its certificate chain, the CA included, so that a node can
        check a pinned CA hash); callers bring no certificate yet."""
        return grpc.ssl_server_credentials([(self.key, self.cert + self.ca)], require_client_auth=False)

    def channel(self, address: str, options: list | None = None,
                server_name: str = COORDINATOR_NAME) -> grpc.Channel:
        """A channel to address that accepts only a server whose certificate carries server_name: by default the
        coordinator (a node's certificate, though of the same CA, cannot pass for it); a peer is named by
        node_server_name."""
        if self.insecure:
            return auth.channel(address, self.token, options)
        creds = grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                             certificate_chain=self.cert)
        return grpc.secure_channel(address, creds,
                                   options=[*(options or []), ("grpc.ssl_target_name_override", server_name)])
