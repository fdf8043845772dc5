"""The agent's part in `tfcluster doctor`: it opens a free port of its task range for a while, so that the other
agents can try to reach that range, and it makes real TCP connects to the ports the coordinator names (other
nodes' peer ports and the task ports they opened), saying how each went. What a job needs of the network is what
is tried: a worker that cannot reach another's port would otherwise just hang.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from tfcluster.commands import PROBE_CONNECT_SECONDS, Probe, ProbeAnswer, ProbeOutcome, ProbeTarget

CONNECTS_AT_ONCE = 16


def listen(port_range: tuple[int, int], seconds: float) -> tuple[int, str]:
    """Listens on the highest free port of the range, on every interface as TensorFlow's servers do, accepting and
    closing connections for `seconds`. Returns the port, or 0 and why none could be opened."""
    first, last = port_range
    for port in range(last, first - 1, -1):
        server = socket.socket()
        try:
            server.bind(("", port))
        except OSError:
            server.close()
            continue
        server.listen(64)
        threading.Thread(target=_accept_until, args=(server, time.monotonic() + seconds), name="probe-listen",
                         daemon=True).start()
        return port, ""
    return 0, f"no free port in the task range {first}-{last}"


def _accept_until(server: socket.socket, deadline: float) -> None:
    with server:
        while (left := deadline - time.monotonic()) > 0:
            server.settimeout(left)
            try:
                connection, _ = server.accept()
            except OSError:  # the deadline passed
                return
            connection.close()


def connect_all(targets: tuple[ProbeTarget, ...]) -> tuple[ProbeOutcome, ...]:
    """A TCP connect to each target, several at once, each bounded by PROBE_CONNECT_SECONDS."""
    with ThreadPoolExecutor(max_workers=CONNECTS_AT_ONCE, thread_name_prefix="probe") as pool:
        return tuple(pool.map(_connect, targets))


def _connect(target: ProbeTarget) -> ProbeOutcome:
    start = time.monotonic()
    try:
        with socket.create_connection((target.address, target.port), timeout=PROBE_CONNECT_SECONDS):
            return ProbeOutcome(target, True, seconds=time.monotonic() - start)
    except OSError as e:
        error = "timed out (a firewall dropping it, or no route)" if isinstance(e, TimeoutError) else \
            (e.strerror or str(e))
        return ProbeOutcome(target, False, error, time.monotonic() - start)


def interface_of(address: str) -> str:
    """The network interface that holds the address ("" when none here does): the one NCCL should use."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    return ""


def answer(probe: Probe, port_range: tuple[int, int], address: str) -> ProbeAnswer:
    """What the agent answers a probe: a port it listens on, or how its connects went; with its clock and the
    interface of its advertise address."""
    port, error = listen(port_range, probe.listen_seconds) if probe.listen_seconds else (0, "")
    outcomes = connect_all(probe.targets) if probe.targets else ()
    return ProbeAnswer(probe.probe_id, port, error, outcomes, time.time(), interface_of(address))
