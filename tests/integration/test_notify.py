"""What systemd hears from the daemons over $NOTIFY_SOCKET: a real datagram socket stands where systemd's
would. READY=1 once serving (the agent: once registered, or after a bounded wait without a coordinator), a
STATUS= line, WATCHDOG=1 while the loops that matter turn and never once one is stuck, STOPPING=1 on
SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from harness import Daemon, free_port, port_block, wait_until
from tfcluster.daemon.agent.agent import Agent, AgentConfig
from tfcluster.daemon.agent.session.discovery import host_info
from tfcluster.daemon.agent.session.liveness import READY_WITHOUT_COORDINATOR_SECONDS, SystemdReporter
from tfcluster.daemon.coordinator.grpc_server import CoordinatorServer
from tfcluster.daemon.coordinator.process import BackgroundCoordinator
from tfcluster.daemon.notify import Notifier

WATCHDOG_SECONDS = 1.0  # beats every 0.5 s


class NotifySocket:
    """Systemd's side: every datagram sent to the address (a path, or @name: abstract), with when it came."""

    def __init__(self, address: str):
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.1)
        self.received: list[tuple[float, dict[str, str]]] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._receive, daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        while not self.closed.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            message = dict(line.split("=", 1) for line in data.decode().splitlines())
            self.received.append((time.monotonic(), message))

    def times(self, key: str) -> list[float]:
        return [at for at, message in list(self.received) if key in message]

    def statuses(self) -> list[str]:
        return [message["STATUS"] for _, message in list(self.received) if "STATUS" in message]

    def wait_for(self, key: str, timeout: float = 30) -> dict[str, str]:
        return wait_until(lambda: next((m for _, m in list(self.received) if key in m), None), timeout,
                          what=f"{key} on {self.address}")

    def close(self) -> None:
        self.closed.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def notify_socket():
    opened: list[NotifySocket] = []

    def open_socket(address: str) -> NotifySocket:
        opened.append(NotifySocket(address))
        return opened[-1]
    yield open_socket
    for s in opened:
        s.close()


@pytest.fixture
def daemons():
    started: list[Daemon] = []

    def start(name: str, args: list[str], log_dir: Path, notify: NotifySocket,
              watchdog_seconds: float = WATCHDOG_SECONDS) -> Daemon:
        env = {"NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": str(int(watchdog_seconds * 1e6))}
        started.append(Daemon(name, args, log_dir / f"{name}.log").start(env=env))
        return started[-1]
    yield start
    for daemon in started:
        daemon.kill()


def terminate(daemon: Daemon) -> None:
    os.killpg(daemon.proc.pid, signal.SIGTERM)
    daemon.proc.wait(timeout=20)


def beats_between(notify: NotifySocket, start: float, end: float) -> list[float]:
    return [at for at in notify.times("WATCHDOG") if start < at < end]


def test_coordinator_and_agent_processes_tell_systemd_ready_status_beats_and_stopping(tmp_path, notify_socket,
                                                                                      daemons):
    to_coordinator = notify_socket(str(tmp_path / "coordinator.sock"))
    address = f"127.0.0.1:{free_port()}"
    coordinator = daemons("coordinator", ["coordinator", "--insecure", "--listen", address, "--state-dir",
                                          str(tmp_path / "coordinator")], tmp_path, to_coordinator)
    ready = to_coordinator.wait_for("READY")
    assert ready["STATUS"] == "0 nodes READY, 0 jobs running, 0 pending"
    with socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1])), timeout=5):
        pass  # READY=1 means it serves

    to_agent = notify_socket(str(tmp_path / "agent.sock"))
    base = port_block()
    agent = daemons("agent", ["agent", "--insecure", "--coordinator", address, "--name", "a", "--advertise-address",
                              "127.0.0.1", "--port-range", f"{base}-{base + 99}", "--gpu-inventory", "none",
                              "--state-dir", str(tmp_path / "agent")], tmp_path, to_agent)
    assert to_agent.wait_for("READY")["STATUS"] == f"registered with {address}, 0 tasks running"
    wait_until(lambda: "1 node READY, 0 jobs running, 0 pending" in to_coordinator.statuses(), 10,
               what="the coordinator's status to count the agent's node")

    since = time.monotonic()
    time.sleep(3)
    for notify in (to_coordinator, to_agent):
        assert len(beats_between(notify, since, time.monotonic())) >= 4, notify.received[-10:]

    terminate(agent)
    assert to_agent.times("STOPPING") and agent.proc.returncode == 0
    wait_until(lambda: "0 nodes READY, 1 LOST, 0 jobs running, 0 pending" in to_coordinator.statuses(), 15,
               what="the coordinator's status to count the lost node")
    terminate(coordinator)
    assert to_coordinator.wait_for("STOPPING", timeout=1) and coordinator.proc.returncode == 0


def test_an_agent_without_its_coordinator_is_ready_after_a_bounded_wait_and_keeps_beating(tmp_path, notify_socket,
                                                                                         daemons):
    to_agent = notify_socket(f"@tfcluster-test-{uuid.uuid4().hex}")  # an abstract socket, as systemd may give
    base = port_block()
    dead = f"127.0.0.1:{free_port()}"
    # Longer than a reconnect loop's longest wait (3 s), as the unit's WatchdogSec= is.
    watchdog_seconds = 6.0
    started = time.monotonic()
    agent = daemons("agent", ["agent", "--insecure", "--coordinator", dead, "--name", "alone", "--advertise-address",
                              "127.0.0.1", "--port-range", f"{base}-{base + 99}", "--gpu-inventory", "none",
                              "--state-dir", str(tmp_path / "agent")], tmp_path, to_agent, watchdog_seconds)
    ready = to_agent.wait_for("READY", timeout=READY_WITHOUT_COORDINATOR_SECONDS + 20)
    assert to_agent.times("READY")[0] - started >= READY_WITHOUT_COORDINATOR_SECONDS
    assert ready["STATUS"] == f"coordinator {dead}: unreachable (UNAVAILABLE), retrying; 0 tasks running"
    # The reconnect loop turns while the coordinator is away: the watchdog is fed all along.
    beats = to_agent.times("WATCHDOG")
    assert beats[0] - started < 5 and max(b - a for a, b in zip(beats, beats[1:])) < watchdog_seconds, beats
    terminate(agent)
    assert to_agent.times("STOPPING")


def test_a_blocked_coordinator_loop_sends_no_beat_until_it_runs_again(tmp_path, notify_socket):
    notify = notify_socket(str(tmp_path / "notify.sock"))
    server = CoordinatorServer("127.0.0.1:0", tmp_path / "coordinator", insecure=True)
    coordinator = BackgroundCoordinator(server, Notifier(notify.address, WATCHDOG_SECONDS)).start()
    try:
        assert notify.wait_for("READY")
        wait_until(lambda: len(notify.times("WATCHDOG")) >= 3, 10, what="beats")
        blocked: list[float] = []

        def block_the_loop() -> None:  # as a slow call made on the loop would
            blocked.append(time.monotonic())
            time.sleep(3 * WATCHDOG_SECONDS)
            blocked.append(time.monotonic())
        coordinator.loop.call_soon_threadsafe(block_the_loop)
        wait_until(lambda: len(blocked) == 2, 10, what="the block to end")
        assert beats_between(notify, blocked[0] + 0.1, blocked[1]) == []
        wait_until(lambda: beats_between(notify, blocked[1], time.monotonic() + 1), WATCHDOG_SECONDS * 2,
                   what="beats after the loop runs again")
    finally:
        coordinator.stop()
    assert notify.times("STOPPING")


def test_a_wedged_agent_loop_sends_no_beat_until_it_turns_again(tmp_path, notify_socket, caplog):
    notify = notify_socket(str(tmp_path / "notify.sock"))
    coordinator = BackgroundCoordinator(CoordinatorServer("127.0.0.1:0", tmp_path / "coordinator",
                                                          heartbeat_interval_seconds=0.2, insecure=True)).start()
    base = port_block()
    agent = Agent(AgentConfig(coordinator=coordinator.address, name="a", address="127.0.0.1",
                              port_range=(base, base + 99), gpus=(), host=host_info(), state_dir=tmp_path / "a"))
    reporter = SystemdReporter(agent, Notifier(notify.address, WATCHDOG_SECONDS))
    stop = threading.Event()

    def main_loop() -> None:  # what the agent process's main thread does (agent/main.py)
        while not stop.wait(0.1):
            reporter.tick()
    threads = [threading.Thread(target=agent.run, daemon=True), threading.Thread(target=main_loop, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        assert notify.wait_for("READY")["STATUS"] == f"registered with {coordinator.address}, 0 tasks running"
        wait_until(lambda: len(notify.times("WATCHDOG")) >= 3, 10, what="beats")
        # The supervisor's lock, held as by a deadlock: the heartbeat generator and the events loop wait on it.
        with agent.supervisor.lock:
            held = time.monotonic()
            time.sleep(4 * WATCHDOG_SECONDS)
            released = time.monotonic()
        # Stamps turn stale after the timeout; the check runs every beat interval. The margin past that is for a
        # loaded machine: the last stamp, and a beat's delivery, may come late.
        assert beats_between(notify, held + WATCHDOG_SECONDS + 1.5, released) == []
        assert "not feeding systemd's watchdog: the connection and events loops have stopped" in caplog.text
        wait_until(lambda: beats_between(notify, released, time.monotonic() + 1), 3 * WATCHDOG_SECONDS,
                   what="beats after the loops turn again")
    finally:
        stop.set()
        agent.stop()
        for thread in threads:
            thread.join(timeout=10)
        coordinator.stop()


def test_the_notifier_reads_the_environment_systemd_sets_and_removes_it():
    environ = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid()),
               "PATH": "/usr/bin"}
    notifier = Notifier.from_environment(environ)
    assert (notifier.socket_path, notifier.watchdog_seconds, notifier.beat_interval) == ("/run/systemd/notify", 30, 15)
    assert environ == {"PATH": "/usr/bin"}, "the tasks the agent starts must not inherit them"
    other = Notifier.from_environment({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"})
    assert other.enabled and other.watchdog_seconds == 0, "a watchdog set for another process is not ours"
    assert not Notifier.from_environment({}).enabled


def test_sending_to_a_missing_socket_never_raises_and_is_logged_once(tmp_path, caplog):
    notifier = Notifier(str(tmp_path / "nobody-listens"), 1.0)
    assert notifier.watchdog() is False and notifier.status("x") is False
    assert caplog.text.count("cannot notify systemd") == 1
    assert Notifier().ready("fine") is False, "not under systemd: nothing to send"
