"""The gRPC settings of tfcluster's own processes (every command and both daemons), made before gRPC is imported.

- GRPC_ENABLE_FORK_SUPPORT=0. grpcio turns gRPC's fork handlers on by default: around every fork() they pause
  gRPC's threads in the parent and rebuild its state in the child, and when another thread is inside a call
  they are skipped half-way. A process that forks while its other threads serve and call (the agent starts
  its environment readers, package installs and health programs as the coordinator talks to it) then saw a
  child die before its exec ("Kick failed: eventfd_write: Bad file descriptor"), calls of its own never
  complete, and itself die of a segmentation fault; tests/unit/test_grpc_settings.py runs such a process. tfcluster forks only to exec at once: a child that
  execs keeps nothing of gRPC, so the handlers have nothing to save.
- GRPC_VERBOSITY=ERROR: gRPC's core logs a failed TLS handshake, and each connection a peer ends, on stderr by
  itself; the error a command prints says it in one line.

A variable the user set is left as it is. What is set here is not passed on to tasks (without_ours): a
training program that forks without exec may rely on gRPC's fork handlers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SETTINGS = {"GRPC_ENABLE_FORK_SUPPORT": "0", "GRPC_VERBOSITY": "ERROR"}

_set_here: dict[str, str] = {}


def apply() -> None:
    """Sets each variable the environment does not set already; before the first `import grpc` to take effect."""
    for name, value in SETTINGS.items():
        if name not in os.environ:
            os.environ[name] = _set_here[name] = value


def without_ours(env: Mapping[str, str]) -> dict[str, str]:
    """env less the variables apply() set in this process (those the user set stay)."""
    return {k: v for k, v in env.items() if not (k in _set_here and v == _set_here[k])}
