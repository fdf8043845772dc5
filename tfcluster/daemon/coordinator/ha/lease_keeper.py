"""The leader lease's renewals, sent from a small process of their own (leadership.py decides what they mean).

Why a process: while thousands of agents connect at once, the coordinator's main thread holds Python's GIL most of
the time (measured: three quarters of the wall time during a 5,000-agent registration, mostly inside grpc.aio's
callbacks), and on a loaded host the operating system preempts it while it holds it. A renewal thread in that
process then waited for its turn longer than the 2 s lease: the leader lost the key to a standby, which met the same
storm. This process shares no GIL with the coordinator; it is started with the coordinator, before any storm.

It renews only while the coordinator runs: while its parent is stopped (SIGSTOP, a debugger) it sends nothing, so
etcd counts the lease out as it would for a paused leader; nor when the coordinator's leadership thread has not
said for ACK_TTLS leases that it still runs; when its parent is gone (its stdin closes), it exits.

One JSON object per line. In (stdin): first the gateway's settings {"endpoints": [...], "tls": {...}}, then
{"lease": ID, "valid_until": T, "ttl": N} to renew that lease (ID 0: none) every RENEW_EVERY_SECONDS, sent again
at each renewal the coordinator applies. Out (stdout),
after each renewal: {"lease": ID, "sent": T, "ttl": GRANTED} or {"lease": ID, "sent": T, "error": TEXT}. T is
time.monotonic(), which every process of a host shares (CLOCK_MONOTONIC).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass

from tfcluster.daemon.coordinator.store.api import StoreUnavailable
from tfcluster.daemon.coordinator.store.etcd_gateway import EtcdGateway, EtcdTls

log = logging.getLogger("tfcluster.coordinator")

RENEW_EVERY_SECONDS = 0.4  # several renewals per TTL: one lost answer does not cost the lease
# The coordinator's leadership tells the keeper, at each renewal it applies, that it still runs; the keeper stops
# renewing when it has not heard so for this many TTLs. While 5,000 agents registered on a loaded 2-core host,
# that thread's turns came up to 4 s apart (2 TTLs lost the lease there; 4 never did); a process hung for good
# loses its lease within this many TTLs and one more (10 s).
ACK_TTLS = 4


@dataclass(frozen=True)
class Report:
    """One renewal the keeper sent: when, and what etcd granted (0: it no longer knows the lease) or the error."""
    lease: int
    sent: float
    granted: int = 0
    error: str = ""


class LeaseKeeper:
    """The coordinator's handle on its keeper process. Not thread-safe: one term's leadership uses it at a time."""

    def __init__(self, gateway: EtcdGateway):
        settings = {"endpoints": gateway.endpoints, "tls": dataclasses.asdict(gateway.tls)}
        self.process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, close_fds=True)
        self._buffered = b""
        self._send(settings)

    def renew(self, lease: int, valid_until: float = 0.0, ttl: int = 0) -> None:
        """Renews that lease from now on (0: stops renewing)."""
        self._send({"lease": lease, "valid_until": valid_until, "ttl": ttl})

    def next_report(self, timeout: float) -> Report | None:
        """The next report, or None when none came within timeout. OSError: the keeper is gone."""
        while b"\n" not in self._buffered:
            ready, _, _ = select.select([self.process.stdout], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self.process.stdout.fileno(), 4096)
            if not chunk:
                raise OSError(f"the lease keeper process ended (exit status {self.process.poll()})")
            self._buffered += chunk
        line, self._buffered = self._buffered.split(b"\n", 1)
        data = json.loads(line)
        return Report(int(data["lease"]), float(data["sent"]), int(data.get("ttl", 0)), str(data.get("error", "")))

    def _send(self, message: dict) -> None:
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def close(self) -> None:
        try:
            self.process.stdin.close()  # it exits at once
        except OSError:  # it is gone already: what a failed write left buffered cannot be flushed
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.process.stdout.close()


def keep_alive(gateway: EtcdGateway, lease: int, sent: float, valid_until: float, ttl: int) -> int:
    """One renewal sent at sent: the seconds etcd grants the lease from now (0: it no longer knows it). An answer
    that comes after the lease ran out keeps nothing, so the call is given only what is left of it; once it ran
    out on the coordinator's clock, a TTL: an answer within it still tells whether etcd holds the lease."""
    within = ttl if sent >= valid_until else valid_until - sent
    answer = gateway.call("/v3/lease/keepalive", {"ID": str(lease)}, within=within)
    return int(answer.get("result", {}).get("TTL", 0))


def parent_stopped(pid: int) -> bool:
    """Whether that process is stopped (SIGSTOP, traced): its state in /proc. False where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


class Renewing:
    """The keeper's side: which lease it renews, until when etcd holds it, and when it renews next."""

    def __init__(self, gateway: EtcdGateway, parent: int):
        self.gateway, self.parent = gateway, parent
        self.lease, self.valid_until, self.ttl, self.next_at, self.acked_at = 0, 0.0, 0, 0.0, 0.0

    def take(self, message: dict) -> None:
        """A message from the coordinator: renew this lease (the same one again: its leadership still runs)."""
        lease, self.acked_at = int(message["lease"]), time.monotonic()
        if lease != self.lease:
            self.lease, self.valid_until, self.next_at = lease, 0.0, self.acked_at + RENEW_EVERY_SECONDS
        self.valid_until, self.ttl = max(self.valid_until, float(message["valid_until"])), int(message["ttl"])

    def renew(self) -> dict | None:
        """One renewal, when one is due and the coordinator runs: what to report."""
        self.next_at = time.monotonic() + RENEW_EVERY_SECONDS
        # Not for a coordinator that is stopped, or whose leadership has not said for ACK_TTLS leases that it
        # runs (a process hung with the GIL held): etcd lets the lease go and a standby takes over.
        if not self.lease or parent_stopped(self.parent) or \
                time.monotonic() - self.acked_at > ACK_TTLS * self.ttl:
            return None
        sent = time.monotonic()
        try:
            granted = keep_alive(self.gateway, self.lease, sent, self.valid_until, self.ttl)
        except (StoreUnavailable, RuntimeError) as e:
            return {"lease": self.lease, "sent": sent, "error": str(e)}
        self.valid_until = max(self.valid_until, sent + granted)
        return {"lease": self.lease, "sent": sent, "ttl": granted}


def main() -> None:
    stdin = sys.stdin.buffer.raw
    parent = os.getppid()
    lines = [b""]
    while len(lines) < 2:
        chunk = os.read(stdin.fileno(), 65536)
        if not chunk:
            return
        lines = (lines[0] + chunk).split(b"\n", 1)
    settings, buffered = json.loads(lines[0]), lines[1]
    renewing = Renewing(EtcdGateway(settings["endpoints"], EtcdTls(**settings["tls"])), parent)
    while True:
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            renewing.take(json.loads(line))
        wait = max(0.0, renewing.next_at - time.monotonic()) if renewing.lease else None
        if select.select([stdin], [], [], wait)[0]:
            chunk = os.read(stdin.fileno(), 65536)
            if not chunk:
                return  # the coordinator is gone: its lease runs out in etcd
            buffered += chunk
            continue
        report = renewing.renew()
        if report is not None:
            sys.stdout.write(json.dumps(report) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
