"""The etcd gateway's time budget against real sockets: a call given a deadline shares it among the members, so
one that accepts connections and never answers (a member restarting, still catching up) does not spend the time
the next member answers in."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tfcluster.daemon.coordinator.store.api import StoreUnavailable
from tfcluster.daemon.coordinator.store.etcd_gateway import EtcdGateway


class Answering(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"result": {"TTL": "2"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def members():
    """Two endpoints: one whose kernel accepts connections for a process that never reads them, one answering."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{silent.getsockname()[1]}", f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        silent.close()


def test_a_member_that_never_answers_leaves_the_next_one_time_to_answer(members):
    silent, answering = members
    gateway = EtcdGateway([silent, answering])
    started = time.monotonic()
    answer = gateway.call("/v3/lease/keepalive", {"ID": "7"}, within=1.6)
    took = time.monotonic() - started
    assert answer["result"]["TTL"] == "2"
    assert took < 1.6, f"the call outlived its deadline: {took:.2f} s"
    assert gateway.preferred == 1, "the member that answered is asked first next time"


def test_a_call_with_a_deadline_keeps_it_when_no_member_answers(members):
    silent, _ = members
    gateway = EtcdGateway([silent, silent])
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="cannot reach etcd"):
        gateway.call("/v3/lease/keepalive", {"ID": "7"}, within=1.0)
    took = time.monotonic() - started
    assert took < 1.3, f"the call outlived its deadline, status probes included: {took:.2f} s"
