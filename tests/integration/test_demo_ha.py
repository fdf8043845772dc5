"""`make demo-ha` end to end: the failover it shows meets its figures, and it leaves no process and no dir behind,
whether it runs to its end or is interrupted with Ctrl-C; without etcd it says how to get it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from etcdcluster import needs_etcd

DEMO = [sys.executable, "-m", "tfcluster.demo.ha"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def processes_under(root: str) -> list[str]:
    """Live processes whose command line names root: etcd's members, the coordinators, the agents and the tasks."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and root in " ".join(proc.info["cmdline"] or []):
            found.append(f"{proc.pid}: {' '.join(proc.info['cmdline'])}")
    return found


def demo_root(output: str) -> str:
    match = re.search(r"state and logs in (\S+)", output)
    assert match, output
    return match.group(1)


def assert_left_nothing(root: str) -> None:
    assert processes_under(root) == [], "every process the demo started is stopped"
    assert not Path(root).exists(), "its temporary dir is removed"


@needs_etcd
def test_the_demo_shows_a_failover_within_its_figures_and_leaves_nothing_behind():
    result = subprocess.run(DEMO, capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())  # the console wraps long lines
    served = float(re.search(r"standby served ([\d.]+) s after kill -9", out).group(1))
    back = float(re.search(r"both agents back after ([\d.]+) s", out).group(1))
    assert served <= 5 and back <= 10, out
    assert "SUCCEEDED with 0 restarts, each task launched once: yes" in out
    assert_left_nothing(demo_root(out))


@needs_etcd
def test_ctrl_c_stops_everything_the_demo_started():
    # Ctrl-C as a terminal delivers it, whatever started this test: a shell starts a background job with SIGINT
    # ignored, and a Python started so never raises KeyboardInterrupt.
    demo = subprocess.Popen(DEMO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    try:
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("submitted "):  # every process is up, the job's tasks too
                break
        root = demo_root("".join(lines))
        time.sleep(1)
        assert processes_under(root), "the demo runs its processes"
        demo.send_signal(signal.SIGINT)
        rest = demo.communicate(timeout=60)[0]
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 130, "".join(lines) + rest
    assert "interrupted; stopping everything" in rest
    assert_left_nothing(root)


def test_without_etcd_the_demo_says_how_to_install_it():
    env = {**ENV, "PATH": str(Path(sys.executable).parent)}  # no etcd there
    result = subprocess.run(DEMO, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1
    assert "apt-get install etcd-server" in result.stdout
