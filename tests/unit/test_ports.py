"""The ports the demo and the tests give their servers (tfcluster.demo.etcd.free_port): never one handed out twice,
and none from the kernel's ephemeral range, where any outgoing connection may take it before the server binds it
(a coordinator then cannot start: "Address already in use")."""

from __future__ import annotations

import socket

from tfcluster.demo.etcd import QUIET_PORTS, ephemeral_ports, free_port


def test_ports_handed_out_are_free_distinct_and_none_an_outgoing_connection_could_take():
    first, last = ephemeral_ports()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    if last < QUIET_PORTS[0] or first >= QUIET_PORTS[1]:
        assert all(QUIET_PORTS[0] <= port < QUIET_PORTS[1] for port in ports)
        assert not any(first <= port <= last for port in ports)
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports[0]))  # free indeed
