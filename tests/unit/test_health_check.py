"""The agent's health check (daemon/agent/node/health.py): the operator's program decides, its first line says
why, and the check goes on every interval whatever one run of it did."""

from __future__ import annotations

import threading
import time

from tfcluster.daemon.agent.node.health import HealthCheck


def program(tmp_path, body: str):
    path = tmp_path / "check.sh"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_the_first_line_says_why_and_passing_clears_it(tmp_path):
    sick = tmp_path / "sick"
    check = HealthCheck(program(tmp_path, f"test -e {sick} || exit 0\ncat {sick}\nexit 1"), interval=5.0)
    assert check.check() == ""
    sick.write_text("\nERROR: nhc: /scratch not mounted\nmore\n")
    assert check.check() == "ERROR: nhc: /scratch not mounted" == check.failure
    sick.unlink()
    assert check.check() == "" == check.failure


def test_a_check_that_hangs_fails_within_its_timeout(tmp_path):
    check = HealthCheck(program(tmp_path, "sleep 30"), interval=5.0, timeout=0.5)
    began = time.monotonic()
    assert "did not finish within 0.5 s" in check.check()
    assert time.monotonic() - began < 5


def test_the_check_goes_on_after_a_run_that_broke(tmp_path, monkeypatch):
    check = HealthCheck(program(tmp_path, "echo 'GPU 0 fell off the bus'; exit 1"), interval=0.05)
    broken = iter([RuntimeError("unforeseen")])

    def run_once_broken():
        for error in broken:
            raise error
        return HealthCheck._run(check)

    monkeypatch.setattr(check, "_run", run_once_broken)
    stopped = threading.Event()
    thread = threading.Thread(target=check.run, args=(stopped,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while check.failure != "GPU 0 fell off the bus" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert check.failure == "GPU 0 fell off the bus", "the next run took place"
    finally:
        stopped.set()
        thread.join(5)
    assert not thread.is_alive()
