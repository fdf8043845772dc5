"""Every thread a shim starts is started here, so that the shim knows whether it ever started one: a shim that did
serves no other attempt (tfcluster/daemon/agent/tasks/forked_shim.py). Whether `threading` is imported cannot
tell: an interpreter whose site hooks (a sitecustomize, a .pth file) import logging or threading at startup has it
imported in every process, and its shims would then never run a second attempt, each tiny task paying a fork.

threading is imported on first use, not at the top: a shim whose task ended first needs none (runner.py), and the
launcher imports nothing with an at-fork hook (launcher_process.py).
"""

from __future__ import annotations

from collections.abc import Callable

_started = False  # this process started a thread here; never unset: such a shim ends with its attempt


def start(target: Callable[..., None], name: str, *args):
    """target(*args) on a daemon thread of its own, started; the threading.Thread."""
    global _started
    import threading

    _started = True
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


def ever_started() -> bool:
    """Whether this process started a thread through start()."""
    return _started
