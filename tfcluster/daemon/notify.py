"""Telling systemd how a daemon is doing: the sd_notify protocol (see sd_notify(3)), spoken directly.

A unit with `Type=notify` learns that the daemon serves from `READY=1`, shows the `STATUS=` line in
`systemctl status`, and with `WatchdogSec=` restarts the daemon when `WATCHDOG=1` stops arriving. Each
message is one datagram of `KEY=value` lines sent to the AF_UNIX socket named by $NOTIFY_SOCKET: a path, or
an abstract socket written `@name`. That is a dozen lines, so no library: the PyPI packages that speak it are
either unmaintained (sdnotify) or bind libsystemd (systemd-python, cysystemd), which needs a C library and
its headers on every node for no gain.

Without $NOTIFY_SOCKET (run by hand, in a test, under `Type=simple`) every call returns at once. Sending
never raises: a daemon must keep serving when its service manager cannot be told; the first failure of a
run of failures is logged.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import MutableMapping

log = logging.getLogger("tfcluster.notify")

NOTIFY_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """Sends state changes to systemd. `watchdog_seconds` is the unit's WatchdogSec= (0: no watchdog)."""

    def __init__(self, socket_path: str = "", watchdog_seconds: float = 0.0):
        self.socket_path = socket_path
        self.watchdog_seconds = watchdog_seconds if socket_path else 0.0
        self._address = "\0" + socket_path[1:] if socket_path.startswith("@") else socket_path
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._failing = False

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] | None = None) -> "Notifier":
        """The notifier systemd set up for this process. The variables are removed from the environment:
        the processes a daemon starts (the agent's tasks) inherit it, and must not speak for the service."""
        environ = os.environ if environ is None else environ
        path, usec, pid = (environ.pop(name, "") for name in NOTIFY_VARIABLES)
        seconds = 0.0
        if usec and (not pid or pid == str(os.getpid())):  # a watchdog meant for another process is not ours
            try:
                seconds = int(usec) / 1e6
            except ValueError:
                log.warning("ignoring WATCHDOG_USEC=%r: not a number of microseconds", usec)
        return cls(path, max(seconds, 0.0))

    @property
    def enabled(self) -> bool:
        return bool(self.socket_path)

    @property
    def beat_interval(self) -> float:
        """How often to send WATCHDOG=1: half the timeout, as systemd advises (0: no watchdog)."""
        return self.watchdog_seconds / 2

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *_status(status))

    def status(self, status: str) -> bool:
        return self.send(*_status(status))

    def watchdog(self, status: str = "") -> bool:
        return self.send("WATCHDOG=1", *_status(status))

    def stopping(self, status: str = "") -> bool:
        return self.send("STOPPING=1", *_status(status))

    def send(self, *assignments: str) -> bool:
        """Sends the assignments as one datagram; False when not under systemd or when it could not be sent."""
        if not self.enabled or not assignments:
            return False
        data = "\n".join(assignments).encode()
        try:
            with self._lock:
                if self._socket is None:
                    self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                    # A service manager that stopped reading must never block the daemon (the coordinator
                    # sends from its event loop): a full queue drops this message, the next one follows.
                    self._socket.setblocking(False)
                self._socket.sendto(data, self._address)
        except OSError as e:
            if not self._failing:
                log.warning("cannot notify systemd on %s: %s", self.socket_path, e)
            self._failing = True
            return False
        if self._failing:
            log.info("notifying systemd on %s works again", self.socket_path)
        self._failing = False
        return True

    def close(self) -> None:
        with self._lock:
            if self._socket is not None:
                self._socket.close()
                self._socket = None


def _status(text: str) -> tuple[str, ...]:
    """A STATUS= assignment (one line, as the protocol has one assignment a line), or none for no text."""
    return (f"STATUS={' '.join(text.split())}",) if text else ()
