"""The node's health check: the operator's program (`--health-check-program`), run before the agent registers and
every `--health-check-interval` after, by the convention of Slurm's HealthCheckProgram and LBNL NHC: it exits 0
when the node is fit for work, else non-zero with a line saying why. The agent sends the line with its
registration and each heartbeat; the coordinator drains the node with it, and lifts that drain once the check
passes again (an admin's drain it never touches).
"""

from __future__ import annotations

import logging
import subprocess
import threading
from pathlib import Path

from tfcluster.model import MAX_DRAIN_REASON, printable

log = logging.getLogger("tfcluster.agent")

DEFAULT_INTERVAL_SECONDS = 300.0
TIMEOUT_SECONDS = 60.0  # a check that hangs (a wedged GPU driver, a dead mount) is itself a failure
OUTPUT_BYTES = 64 * 1024  # of its output read for the line of reason


class HealthCheck:
    """Runs the program and keeps its last verdict: "" while the node passes, else the line of reason."""

    def __init__(self, program: Path, interval: float = DEFAULT_INTERVAL_SECONDS,
                 timeout: float = TIMEOUT_SECONDS):
        self.program, self.interval, self.timeout = program, interval, min(timeout, interval)
        self.failure = ""

    def check(self) -> str:
        """Runs the program once; returns (and keeps) its failure, "" when it passed."""
        failure = self._run()
        if failure != self.failure:
            if failure:
                log.warning("health check failed: %s", failure)
            else:
                log.info("health check passes again")
        self.failure = failure
        return failure

    def run(self, stopped: threading.Event) -> None:
        """Checks again every interval until stopped (the first check ran before registering). A check that
        breaks in an unforeseen way is logged and tried again: a thread that died here would leave the node's
        last verdict standing for good (a drain never lifted, or a sick node never drained)."""
        while not stopped.wait(self.interval):
            try:
                self.check()
            except Exception:
                log.exception("the health check could not be run; trying again in %g s", self.interval)

    def _run(self) -> str:
        try:
            done = subprocess.run([str(self.program)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=self.timeout, close_fds=True)
        except subprocess.TimeoutExpired:
            return f"{self.program} did not finish within {self.timeout:g} s"
        except OSError as e:
            return f"cannot run {self.program}: {e.strerror or e}"
        if done.returncode == 0:
            return ""
        line = _first_line(done.stdout) or _first_line(done.stderr)
        how = f"exit code {done.returncode}" if done.returncode > 0 else f"signal {-done.returncode}"
        return _reason(line or f"{self.program} failed ({how}) without a line of reason")


def _first_line(output: bytes) -> str:
    for line in output[:OUTPUT_BYTES].decode(errors="replace").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _reason(line: str) -> str:
    """One safe line that fits a drain's reason."""
    return printable(line)[:MAX_DRAIN_REASON]
