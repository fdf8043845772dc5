"""Finding the coordinator that leads among several: what agents and the CLI share.

`--coordinator a:7070,b:7070` (or TFCLUSTER_COORDINATOR) names several coordinators; one name whose DNS
records give several addresses names each of them. A standby answers every call with UNAVAILABLE and the
leader's address in the trailing metadata key LEADER_METADATA: the caller goes there next. An address that
does not answer at all is passed over for the next one.
"""

from __future__ import annotations

import ipaddress
import socket

import grpc

LEADER_METADATA = "tfcluster-leader"
STANDBY = "this coordinator is a standby"


# A leader whose lease ran out on its own clock (paused, or cut off from etcd) answers a registration so: another
# coordinator may lead by now, and a node registered here could be told nothing this one can store.
LEASE_RAN_OUT = ("this coordinator's leader lease ran out (was it paused, or cut off from etcd?): it takes no "
                 "registration until etcd renews the lease; another coordinator may lead")


def standby_message(leader: str) -> str:
    return f"{STANDBY}; the leader is at {leader}" if leader else \
        f"{STANDBY}; no coordinator leads at the moment (an election is under way)"


def parse(text: str) -> list[str]:
    """HOST:PORT[,HOST:PORT...] -> the addresses, each HOST:PORT; a lone host name with several DNS records
    becomes one address per record. Raises ValueError naming what is not HOST:PORT."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    for entry in entries:
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"expected HOST:PORT[,HOST:PORT...], got {text!r}")
    if len(entries) == 1:
        return _each_record(entries[0])
    return entries


def _each_record(entry: str) -> list[str]:
    host, _, port = entry.rpartition(":")
    try:
        ipaddress.ip_address(host.strip("[]"))
        return [entry]
    except ValueError:
        pass
    try:
        records = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError:
        return [entry]  # unresolvable now: gRPC resolves it again at each try
    addresses = list(dict.fromkeys(r[4][0] for r in records if r[0] == socket.AF_INET))
    return [f"{a}:{port}" for a in addresses] if len(addresses) > 1 else [entry]


def leader_hint(error: grpc.RpcError) -> str:
    """The leader's address a standby named in its refusal; "" when the error is not a standby's."""
    if not hasattr(error, "trailing_metadata") or error.code() != grpc.StatusCode.UNAVAILABLE:
        return ""
    for key, value in error.trailing_metadata() or ():
        if key == LEADER_METADATA:
            return value if isinstance(value, str) else value.decode()
    return ""


def is_standby(error: grpc.RpcError) -> bool:
    return hasattr(error, "details") and (error.details() or "").startswith(STANDBY)


def is_lease_ran_out(error: grpc.RpcError) -> bool:
    return hasattr(error, "details") and error.details() == LEASE_RAN_OUT


def unreachable(answer: grpc.RpcError | None) -> bool:
    """Whether a call's error says the coordinator was not reached (no connection, or the one open broke), rather
    than answered: a standby's refusal, a lease that ran out and a call that ended without a word all answer."""
    return answer is not None and hasattr(answer, "code") and answer.code() == grpc.StatusCode.UNAVAILABLE and \
        not is_standby(answer) and not is_lease_ran_out(answer) and not leader_hint(answer)


def says_of(current: str, answer: grpc.RpcError | None) -> bool | None:
    """What another coordinator's answer to a health check says of the coordinator at current, on its own: True,
    it still leads (a standby names it); False, it no longer does (a standby names another leader); None, the
    answer alone does not tell: no answer, no leader named while an election is under way, or the other serves
    (None as the answer), which a coordinator in another cluster given by mistake would do as well."""
    if answer is not None and is_standby(answer):
        hint = leader_hint(answer)
        if hint:
            return hint == current
    return None


def leads_elsewhere(current: str, answers: list[grpc.RpcError | None]) -> bool:
    """Whether the other coordinators' answers to a health check (None: it answered, so it serves) say that the
    coordinator at current no longer leads: one of them serves, or a standby names another leader or none. Only
    then does an agent leave a coordinator that gave no pulse in time: one that merely falls behind (thousands of
    agents registering) still leads, and every agent leaving it would come back to it and register again."""
    for error in answers:
        if error is None or (is_standby(error) and leader_hint(error) != current):
            return True
    return False


class Coordinators:
    """The addresses to try, the one in use first. Not thread-safe: one user (a session, a client) each."""

    def __init__(self, text: str):
        self.addresses = parse(text)
        self.index = 0
        self.hinted = ""  # an address a standby named that the list does not hold

    @property
    def current(self) -> str:
        return self.hinted or self.addresses[self.index]

    @property
    def several(self) -> bool:
        return len(self.addresses) > 1 or bool(self.hinted)

    def failed(self, error: grpc.RpcError | None = None) -> bool:
        """The current address did not serve: the next one to try is the leader it named, else the next in
        the list. True when the caller moved to another address. One that names itself has just won an election
        and serves in a moment: it is kept."""
        hint = leader_hint(error) if error is not None else ""
        if hint == self.current:
            return False
        if hint:
            self.follow(hint)
            return True
        if self.hinted:
            self.hinted = ""
            return True
        if len(self.addresses) > 1:
            self.index = (self.index + 1) % len(self.addresses)
            return True
        return False

    def follow(self, leader: str) -> None:
        """The leader is at this address (a standby named it, or it serves): the next one to try."""
        if leader in self.addresses:
            self.index, self.hinted = self.addresses.index(leader), ""
        else:
            self.hinted = leader
