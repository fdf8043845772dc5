"""The CLI's client during an election: once a standby has answered, naming a leader that is gone, the client
waits for the new leader however its tries went, rather than failing when it has tried every address."""

from __future__ import annotations

import grpc

from tfcluster import client as client_module
from tfcluster.client import Client
from tfcluster.credentials import Credentials
from tfcluster.leaders import LEADER_METADATA, standby_message

GONE = "127.0.0.1:2"  # the leader just killed: between two standbys in the list, which still name it


class Refused(grpc.RpcError):
    def __init__(self, details: str, leader: str = ""):
        self._details, self._leader = details, leader

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return self._details

    def trailing_metadata(self):
        return ((LEADER_METADATA, self._leader),) if self._leader else ()


def answer(address: str) -> Refused:
    """What each coordinator answers just after the leader was killed."""
    if address == GONE:
        return Refused("failed to connect to all addresses; last error: Connection refused")
    return Refused(standby_message(GONE), GONE)


def test_a_client_that_heard_a_standby_waits_for_the_election_after_trying_every_address(monkeypatch):
    monkeypatch.setattr(client_module, "ELECTION_POLL_SECONDS", 0.0)
    client = Client("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", Credentials())
    try:
        tried = [client.address]
        for attempt in range(1, 9):
            assert client._follow(answer(client.address), attempt), f"gave up after trying {tried}"
            tried.append(client.address)
        assert set(tried) == {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}
    finally:
        client.close()
