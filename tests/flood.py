"""An attacker against a coordinator, in a process of its own (so that its threads do not slow the measuring
test's own calls): for a few seconds it sends the join port oversized, malformed and too many calls without
any certificate, holds many idle and half-open connections there, and sends oversized calls to the main port
with a viewer's and a node's certificate. Prints, as JSON, the status codes each kind of call got.

    python flood.py CONFIG.json   (join, main: addresses; ca, viewer, node: [ca, cert, key] PEM paths; seconds)

Or, with `job` in the config, an insider: a user who opens thousands of WatchJob calls on his own job at once
over a few connections, and holds those the coordinator lets through for a few seconds.

    python flood.py CONFIG.json   (main; ca, user: PEM paths; job; streams; connections; seconds)
"""

from __future__ import annotations

import collections
import json
import socket
import sys
import threading
import time
from pathlib import Path

import grpc

COORDINATOR_NAME = "coordinator.tfcluster.invalid"  # pki.COORDINATOR_NAME, without importing tfcluster
JOIN, GET_STATUS = "/tfcluster.v1.JoinService/Join", "/tfcluster.v1.ControlService/GetStatus"
REGISTER = "/tfcluster.v1.AgentService/Register"
WATCH = "/tfcluster.v1.ControlService/WatchJob"
BIG = 60 * 1000 * 1000


def join_request(token: str, name: str, csr: bytes) -> bytes:
    """A JoinRequest on the wire, made by hand: a 60 MB one is written once, not built field by field."""
    def field(number: int, value: bytes) -> bytes:
        return bytes([number << 3 | 2]) + varint(len(value)) + value
    return field(1, token.encode()) + field(2, name.encode()) + field(3, csr)


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


class Attacker:
    def __init__(self, config: dict):
        self.config, self.until = config, 0.0
        self.codes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.details: dict[str, str] = {}
        self.lock = threading.Lock()
        self.ca = Path(config["ca"]).read_bytes()

    def channel(self, address: str, pems: list[str] | None = None, own_connection: bool = False) -> grpc.Channel:
        if pems:
            ca, cert, key = (Path(p).read_bytes() for p in pems)
            creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        else:
            creds = grpc.ssl_channel_credentials(root_certificates=self.ca)
        # Channels to one address share a connection unless each keeps its subchannels to itself.
        return grpc.secure_channel(address, creds, options=[("grpc.ssl_target_name_override", COORDINATOR_NAME),
                                                            ("grpc.max_send_message_length", -1),
                                                            ("grpc.use_local_subchannel_pool", int(own_connection))])

    def call(self, kind: str, channel: grpc.Channel, method: str, body: bytes, timeout: float = 10) -> None:
        self.record(kind, lambda: channel.unary_unary(method)(body, timeout=timeout))

    def record(self, kind: str, call) -> None:
        """Counts how a call ended, by its status code, and keeps the first details of each."""
        try:
            call()
            code, details = "OK", ""
        except grpc.RpcError as e:
            code, details = e.code().name, e.details() or ""
        with self.lock:
            self.codes[kind][code] += 1
            self.details.setdefault(f"{kind} {code}", details[:300])

    def repeat(self, kind: str, address: str, method: str, body: bytes, pems=None, fresh: bool = False) -> None:
        """Calls until the flood is over, on one channel, or a new channel (a new connection) for each call."""
        channel = self.channel(address, pems)
        while time.monotonic() < self.until:
            if fresh:
                channel.close()
                channel = self.channel(address, pems)
            self.call(kind, channel, method, body)
        channel.close()

    def burst(self, kind: str, address: str, method: str, body: bytes, pems=None, fresh: bool = False) -> None:
        """Calls 50 at a time on one channel, until the flood is over: far more than the rate lets through."""
        channel = self.channel(address, pems)
        call = channel.unary_unary(method)
        while time.monotonic() < self.until:
            for future in [call.future(body, timeout=10) for _ in range(50)]:
                self.record(kind, future.result)
        channel.close()

    def hold_connections(self, count: int) -> None:
        """Connections that never finish TLS (half of them send a few bytes of a handshake), held to the end."""
        host, port = self.config["join"].rsplit(":", 1)
        held = []
        for i in range(count):
            try:
                s = socket.create_connection((host, int(port)), timeout=2)
                if i % 2:
                    s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
                held.append(s)
            except OSError as e:
                with self.lock:
                    self.codes["held connections"][type(e).__name__] += 1
        with self.lock:
            self.codes["held connections"]["opened"] += len(held)
        while time.monotonic() < self.until:
            time.sleep(0.05)
        for s in held:
            s.close()

    def hold_streams(self) -> dict:
        """Opens `streams` WatchJob calls on `job` at once, spread over `connections` connections, and holds
        those let through (each got the job's status) until `seconds` have passed since the first was opened;
        then cancels them, as a client that goes away does."""
        c = self.config
        body = b"\x0a" + varint(len(c["job"].encode())) + c["job"].encode()
        channels = [self.channel(c["main"], c["user"], own_connection=True) for _ in range(c["connections"])]
        began = time.monotonic()
        calls = [channels[i % len(channels)].unary_stream(WATCH)(body, timeout=c["seconds"] + 60)
                 for i in range(c["streams"])]
        held = []

        def first_status(call) -> None:
            next(call)  # raises the call's refusal
            held.append(call)
        for call in calls:
            self.record("watch", lambda call=call: first_status(call))
        answered = time.monotonic() - began
        time.sleep(max(0.0, began + c["seconds"] - time.monotonic()))
        for call in held:
            call.cancel()
        for channel in channels:
            channel.close()
        return {"codes": {k: dict(v) for k, v in self.codes.items()}, "details": self.details,
                "held": len(held), "all_answered_seconds": round(answered, 3)}

    def run(self) -> dict:
        c = self.config
        junk = join_request("not-a-token", "flood", b"-----BEGIN CERTIFICATE REQUEST-----")
        work = [
            ("join oversized", c["join"], JOIN, join_request("t", "n", b"x" * BIG), None, False),
            ("join oversized", c["join"], JOIN, join_request("t", "n", b"x" * BIG), None, True),
            ("join malformed", c["join"], JOIN, b"\x1a\xff\xff\xff\xff\x0f", None, True),
            ("join not served", c["join"], REGISTER, b"", None, False),
            ("join not served", c["join"], GET_STATUS, b"", None, False),
            ("join burst", c["join"], JOIN, junk, None, False),
            ("viewer oversized", c["main"], GET_STATUS, b"\x0a" + varint(BIG) + b"j" * BIG, c["viewer"], False),
            ("viewer over the bound", c["main"], GET_STATUS, b"\x0a" + varint(1 << 20) + b"j" * (1 << 20),
             c["viewer"], False),
            ("node oversized", c["main"], REGISTER, b"\x12" + varint(20 << 20) + b"t" * (20 << 20), c["node"], False),
        ]
        work.append(("join burst", c["join"], JOIN, junk, None, False))
        self.until = time.monotonic() + c["seconds"]  # from now: the bodies above take a while to build
        threads = [threading.Thread(target=self.hold_connections, args=(c.get("connections", 300),))]
        threads += [threading.Thread(target=self.burst if w[0] == "join burst" else self.repeat, args=w)
                    for w in work if w[0] in c.get("only", [w[0]])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"codes": {k: dict(v) for k, v in self.codes.items()}, "details": self.details}


if __name__ == "__main__":
    attacker = Attacker(json.loads(Path(sys.argv[1]).read_text()))
    print(json.dumps(attacker.hold_streams() if "job" in attacker.config else attacker.run()))
