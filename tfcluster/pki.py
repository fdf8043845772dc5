"""The cluster's certificate authority, with the `cryptography` package: who is who in a tfcluster cluster.

One CA signs every certificate. A certificate names its holder (CN) and its role (OU): the coordinator,
an admin or a viewer (people and scripts, `tfcluster ca issue`), or a node (an agent, which gets its
certificate by joining with a token and renews it well before it expires). Every listener requires a
certificate of this CA, and what a caller may do follows from the role and the name in it, never from
what a message says.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Files of a credentials directory, the names servers are checked by, and PkiError live with the credentials,
# which clients load without this module's cryptography.
from tfcluster.credentials import (CA_CERT, CA_KEY, CLIENT_CERT, CLIENT_KEY, COORDINATOR_NAME,  # noqa: F401
                                   NODE_CERT, NODE_KEY, NODE_NAME_SUFFIX, SERVER_CERT, SERVER_KEY, PkiError,
                                   node_server_name)
from tfcluster.model import NODE_NAME_RE

COORDINATOR, ADMIN, USER, VIEWER, NODE = "coordinator", "admin", "user", "viewer", "node"
PEOPLE_ROLES = (ADMIN, USER, VIEWER)
# A person's groups travel in their certificate as Organization (O) attributes, one per group, as Kubernetes
# reads a client certificate's O as its groups: the coordinator's policy gives groups quotas and limits.
GROUP_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
CA_YEARS = 10
PERSON_DAYS = 365
COORDINATOR_DAYS = 825
NODE_HOURS = 24          # node certificates are short-lived and renewed at about two thirds of that
RENEW_AT = 2 / 3
BACKDATE = datetime.timedelta(minutes=5)  # a certificate is valid from a little before it was issued: clock skew


@dataclass(frozen=True)
class Identity:
    """Who a certificate says its holder is, and when it was issued."""
    role: str
    name: str
    issued: float = 0.0
    groups: tuple[str, ...] = ()
    expires: float = field(default=0.0, compare=False)  # when the certificate ends: not who the holder is

    def __str__(self) -> str:
        return f"{self.role} {self.name}"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_private(path: Path, data: bytes) -> None:
    """Writes a secret readable by its owner only (created 0600, never briefly wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _name(common_name: str, role: str, groups: tuple[str, ...] = ()) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role)]
                     + [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups])


def _sans(names: list[str]) -> list[x509.GeneralName]:
    sans: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    return sans


@dataclass
class Authority:
    """The CA: its certificate, and its key when this process may sign."""
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey | None = None

    @classmethod
    def create(cls) -> "Authority":
        key = new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tfcluster cluster CA")])
        now = _now()
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - BACKDATE)
                .not_valid_after(now + datetime.timedelta(days=365 * CA_YEARS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        return cls(cert, key)

    @classmethod
    def load(cls, directory: Path, with_key: bool = False) -> "Authority":
        cert = load_cert(directory / CA_CERT)
        key = None
        if with_key:
            try:
                key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
            except OSError as e:
                raise PkiError(f"{directory / CA_KEY}: cannot read the CA key: {e.strerror or e}") from None
            except ValueError as e:
                raise PkiError(f"{directory / CA_KEY}: not a private key: {e}") from None
        return cls(cert, key)

    @property
    def pem(self) -> bytes:
        return cert_pem(self.cert)

    def sign(self, public_key, common_name: str, role: str, lifetime: datetime.timedelta,
             sans: list[str] = (), issued: datetime.datetime | None = None,
             groups: tuple[str, ...] = ()) -> x509.Certificate:
        """A certificate for role; sans are exactly the names given (the caller decides them, never a request).
        People's certificates only prove who calls (client auth); servers' also who serves. `issued` (default
        now) is the issue time the certificate carries, backdated for clock skew."""
        if self.key is None:
            raise PkiError("this CA has no key to sign with")
        issued = issued or _now()
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if role in PEOPLE_ROLES else \
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (x509.CertificateBuilder().subject_name(_name(common_name, role, groups)).issuer_name(self.cert.subject)
                   .public_key(public_key).serial_number(x509.random_serial_number())
                   .not_valid_before(issued - BACKDATE).not_valid_after(issued + lifetime)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.cert.public_key()),
                                  critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(_sans(list(sans))), critical=False)
        return builder.sign(self.key, hashes.SHA256())

    def issue(self, common_name: str, role: str, lifetime: datetime.timedelta,
              sans: list[str] = (), groups: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
        """A new key and its certificate, as PEM."""
        key = new_key()
        return key_pem(key), cert_pem(self.sign(key.public_key(), common_name, role, lifetime, sans, groups=groups))

    def sign_node(self, csr_pem: bytes, node: str, lifetime: datetime.timedelta = None, addresses: list[str] = (),
                  issued: datetime.datetime | None = None) -> bytes:
        """A node's certificate for a CSR the node made itself (its key never leaves it). Only the CSR's key is
        used: the name, the role and the addresses are the coordinator's to decide (check_node_name, and the
        addresses it has seen the node at), so a node can never ask for a name that is not its own."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as e:
            raise PkiError(f"csr: not a PEM certificate signing request: {e}") from None
        if not csr.is_signature_valid:
            raise PkiError("csr: its signature does not match its key")
        lifetime = lifetime or datetime.timedelta(hours=NODE_HOURS)
        return cert_pem(self.sign(csr.public_key(), node, NODE, lifetime, [node_server_name(node), *addresses],
                                  issued))

    def verify(self, cert: x509.Certificate) -> None:
        """Raises PkiError unless this CA signed cert and it is valid now."""
        try:
            cert.verify_directly_issued_by(self.cert)
        except (ValueError, TypeError, InvalidSignature):
            raise PkiError(f"{cert.subject.rfc4514_string()}: not signed by this cluster's CA") from None
        now = _now()
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise PkiError(f"{cert.subject.rfc4514_string()}: not valid now (valid "
                           f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} to {cert.not_valid_after_utc:%Y-%m-%d %H:%M})")


def load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except OSError as e:
        raise PkiError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise PkiError(f"{path}: not a PEM certificate: {e}") from None


def check_key_matches(path: Path, cert: x509.Certificate) -> None:
    """Raises PkiError unless the key in path is the certificate's (a renewal cut short leaves a mismatch)."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError) as e:
        raise PkiError(f"{path}: cannot read the key: {e}") from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, spki) != \
            cert.public_key().public_bytes(serialization.Encoding.DER, spki):
        raise PkiError(f"{path}: not the key of its certificate")


def identity(cert: x509.Certificate) -> Identity:
    def first(oid) -> str:
        values = cert.subject.get_attributes_for_oid(oid)
        return str(values[0].value) if values else ""
    groups = tuple(sorted(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)))
    return Identity(role=first(NameOID.ORGANIZATIONAL_UNIT_NAME), name=first(NameOID.COMMON_NAME),
                    issued=(cert.not_valid_before_utc + BACKDATE).timestamp(), groups=groups,
                    expires=cert.not_valid_after_utc.timestamp())


def ca_hash(cert: x509.Certificate) -> str:
    """`sha256:<hex>` of the CA's public key (its SubjectPublicKeyInfo), as kubeadm pins a CA."""
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return f"sha256:{hashlib.sha256(spki).hexdigest()}"


def new_csr(node: str) -> tuple[bytes, bytes]:
    """A node's new key and a CSR for it. The CSR carries the key; what the certificate says is the CA's choice."""
    key = new_key()
    csr = x509.CertificateSigningRequestBuilder().subject_name(_name(node, NODE)).sign(key, hashes.SHA256())
    return key_pem(key), csr.public_bytes(serialization.Encoding.PEM)


def check_node_name(node: str, reserved: set[str]) -> None:
    """Raises PkiError unless node may be a node's name: a node name is neither an address nor a name the
    coordinator is reached by (reserved: its certificate's names), so no node's certificate can look like the
    coordinator's to a client that checks names only (a browser, Prometheus)."""
    if not NODE_NAME_RE.fullmatch(node):
        raise PkiError(f"node name {node[:80]!r}: expected letters, digits, '.', '_' or '-' (at most 253)")
    lowered = node.lower().rstrip(".")
    if lowered == "localhost" or lowered.endswith(".localhost") or lowered.endswith(".invalid"):
        raise PkiError(f"node name {node!r} is reserved; give the agent another --name")
    if _is_address(node):
        raise PkiError(f"node name {node!r} is an IP address; give the agent a name (--name)")
    if lowered in {name.lower() for name in reserved}:
        raise PkiError(f"node name {node!r} is a name of the coordinator; give the agent another --name")


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def server_names(cert: x509.Certificate) -> list[str]:
    """The DNS names and IP addresses a certificate is valid for."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*sans.get_values_for_type(x509.DNSName), *(str(a) for a in sans.get_values_for_type(x509.IPAddress))]


def default_sans() -> list[str]:
    """The names a coordinator made on this host is reached by: its host names, localhost, and its IPv4s."""
    names = ["localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()]
    try:
        names += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        pass
    return names


def init_ca(directory: Path, sans: list[str]) -> Authority:
    """A new cluster: the CA, the coordinator's certificate, and an admin's credentials in directory/admin."""
    if (directory / CA_KEY).exists():
        raise PkiError(f"{directory / CA_KEY} exists: this directory already holds a cluster CA")
    ca = Authority.create()
    directory.mkdir(parents=True, exist_ok=True)
    write_private(directory / CA_KEY, key_pem(ca.key))
    (directory / CA_CERT).write_bytes(ca.pem)
    write_coordinator_certificate(ca, directory, [*default_sans(), *sans])
    write_credentials(ca, directory / "admin", "admin", ADMIN)
    return ca


def write_coordinator_certificate(ca: Authority, directory: Path, names: list[str]) -> None:
    """The coordinator's key and certificate: the names it is reached by, and COORDINATOR_NAME, which clients
    check (only a coordinator's certificate carries it)."""
    key, cert = ca.issue(COORDINATOR, COORDINATOR, datetime.timedelta(days=COORDINATOR_DAYS),
                         [COORDINATOR_NAME, *names])
    write_private(directory / SERVER_KEY, key)
    (directory / SERVER_CERT).write_bytes(cert)


def upgrade_coordinator_certificate(directory: Path) -> bool:
    """A coordinator certificate made before clients checked COORDINATOR_NAME is made again with the same names
    and that one; True when it was. Needs the CA key (the coordinator signs nodes' certificates with it)."""
    cert = load_cert(directory / SERVER_CERT)
    names = server_names(cert)
    if COORDINATOR_NAME in names:
        return False
    write_coordinator_certificate(Authority.load(directory, with_key=True), directory, names)
    return True


def write_credentials(ca: Authority, out: Path, name: str, role: str, groups: tuple[str, ...] = ()) -> None:
    """A directory a person or a script points --tls-dir at: ca.crt, client.crt, client.key."""
    if role not in PEOPLE_ROLES:
        raise PkiError(f"--role: expected admin, user or viewer, got {role!r}")
    if not NODE_NAME_RE.fullmatch(name):
        raise PkiError(f"--name: expected letters, digits, '.', '_' or '-' (at most 253), got {name!r}")
    for group in groups:
        if not GROUP_RE.fullmatch(group):
            raise PkiError(f"--group: expected letters, digits, '.', '_' or '-' (at most 64), got {group!r}")
    key, cert = ca.issue(name, role, datetime.timedelta(days=PERSON_DAYS), groups=tuple(sorted(set(groups))))
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    (out / CA_CERT).write_bytes(ca.pem)
    write_private(out / CLIENT_KEY, key)
    (out / CLIENT_CERT).write_bytes(cert)


# What a certificate's holder is told once its name is no longer its own (the coordinator and the agent say it).
REMOVED = "was removed from the cluster"
REPLACED = "was replaced: another holder took its name over"


def token_hash(secret: str) -> str:
    """How a join token's secret is kept: its hash alone."""
    return hashlib.sha256(secret.encode()).hexdigest()
