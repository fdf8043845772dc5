"""A task's output within its limit: the shim keeps the head and the newest bytes, `tfcluster logs` (the agent's
log server) shows them with one marker line for what was dropped, the watchdog's byte count keeps growing, and
the status view's last lines show progress bars in their final state."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tfcluster import layout
from tfcluster.commands import Launch, ReadLog
from tfcluster.daemon.agent.node.logs import LogServer
from tfcluster.daemon.agent.shim.taskfiles import LaunchFile, ShimStatus
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.daemon.agent.shim.tasklog import (MIN_LIMIT_BYTES, LastLines, OutputReader, OutputWriter, dropped_marker,
                                            total_bytes)
from tfcluster.model import Attempt, Phase

LIMIT = MIN_LIMIT_BYTES  # 64 KiB: rotation shows with little output
ATTEMPT = Attempt("rot-1", "worker", 0, 1)
MARKER = re.compile(rb"\[tfcluster: (\d+) bytes of output dropped here\]\n")


def numbered(count: int, last: str = "the end") -> bytes:
    return "".join(f"line {i}\n" for i in range(count)).encode() + last.encode()


def run_shim(state_dir: Path, script: str, limit: int = LIMIT) -> Path:
    """Runs a task through the real shim, as the agent does, until it ends; returns its attempt dir."""
    directory = layout.attempt_dir(state_dir, ATTEMPT.job_id, ATTEMPT.type, ATTEMPT.index, ATTEMPT.number)
    directory.mkdir(parents=True)
    LaunchFile(ATTEMPT, (sys.executable, "-c", script), dict(os.environ), stop_grace_seconds=1,
               log_limit_bytes=limit).write(directory)
    shim = subprocess.Popen([sys.executable, "-m", "tfcluster.daemon.agent.shim.runner", str(directory)],
                            stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        assert shim.wait(timeout=60) == 0
    finally:
        _kill_group(shim.pid)
        status = ShimStatus.read(directory)
        _kill_group(status.pgid)
    assert status.phase == Phase.EXITED and status.exit.exit_code == 0, status
    return directory


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def serve_log(state_dir: Path, follow: bool = False, tail_lines: int = 0) -> bytes:
    """What `tfcluster logs` gets from the agent for the attempt: LogData until eof."""
    chunks, done = [], threading.Event()

    def send(data) -> None:
        chunks.append(data)
        if data.eof:
            done.set()
    LogServer(Supervisor(state_dir, lambda record: None), send).read(ReadLog("n", 1, ATTEMPT, follow, tail_lines))
    assert done.wait(20), "the log server never finished"
    assert not chunks[-1].error, chunks[-1].error
    return b"".join(c.data for c in chunks)


def split_at_marker(served: bytes) -> tuple[bytes, int, bytes]:
    markers = list(MARKER.finditer(served))
    assert len(markers) == 1, served[:200]
    m = markers[0]
    return served[:m.start()], int(m.group(1)), served[m.end():]


def test_output_within_the_limit_is_served_exactly(tmp_path):
    script = ("import sys\nout = sys.stdout.buffer\n"
              "out.write(b'progress 1\\rprogress 2\\r\\n'); out.write(bytes(range(256))); out.write(b'no newline')")
    directory = run_shim(tmp_path, script)
    expected = b"progress 1\rprogress 2\r\n" + bytes(range(256)) + b"no newline"
    assert serve_log(tmp_path) == expected
    assert serve_log(tmp_path, follow=True) == expected
    assert sorted(os.listdir(directory)) == sorted([layout.LAUNCH_FILE, layout.STATUS_FILE, layout.OUTPUT_FILE])


def test_long_output_keeps_head_and_tail_with_one_marker_between(tmp_path):
    full = numbered(30000)  # about 290 KB through a 64 KiB limit
    directory = run_shim(tmp_path, "import sys\nsys.stdout.write(''.join(f'line {i}\\n' for i in range(30000)) + "
                                   "'the end')")
    served = serve_log(tmp_path)
    head, dropped, tail = split_at_marker(served)
    assert full.startswith(head) and head.endswith(b"\n") and len(head) >= LIMIT // 4
    assert full.endswith(tail) and full[-len(tail) - 1:-len(tail)] == b"\n"  # the tail starts at a line
    assert len(head) + dropped + len(tail) == len(full)
    assert LIMIT // 2 <= len(tail) and len(head) + len(tail) <= LIMIT + 16 * 1024
    on_disk = sum(f.stat().st_size for f in directory.iterdir() if f.name.startswith("output"))
    assert on_disk == len(head) + len(tail)
    # The hang watchdog's measure counts every byte written, dropped ones too.
    assert total_bytes(directory) == len(full)
    assert serve_log(tmp_path, tail_lines=3) == b"line 29998\nline 29999\nthe end"
    assert serve_log(tmp_path, follow=True) == served


def test_a_follower_sees_every_byte_it_keeps_up_with_and_a_marker_for_what_rotated_away(tmp_path):
    writer = OutputWriter(tmp_path, LIMIT)
    full = numbered(40000).replace(b"the end", b"")
    keeping_up, lagging = OutputReader(tmp_path), OutputReader(tmp_path)
    seen_by_keeping_up = b""
    for start in range(0, len(full), 1000):
        writer.write(full[start:start + 1000])
        while data := keeping_up.read(4096):
            seen_by_keeping_up += data
    writer.close()
    assert seen_by_keeping_up == full
    seen_by_lagging = b""
    while data := lagging.read(4096):
        seen_by_lagging += data
    head, dropped, tail = split_at_marker(seen_by_lagging)
    assert head + full[len(head):len(head) + dropped] + tail == full
    assert total_bytes(tmp_path) == len(full)


def test_a_line_without_end_does_not_stop_rotation(tmp_path):
    writer = OutputWriter(tmp_path, LIMIT)
    writer.write(b"x" * (5 * LIMIT))  # no line break anywhere: files end at their size plus the slack
    writer.close()
    reader, served = OutputReader(tmp_path), b""
    while data := reader.read(65536):
        served += data
    head, dropped, tail = split_at_marker(served)
    assert head.endswith(b"x\n")  # the marker gets a line of its own
    assert set(head[:-1] + tail) == {ord("x")} and len(head) - 1 + dropped + len(tail) == 5 * LIMIT
    assert served == head + dropped_marker(dropped) + tail


def keras_progress_bar(steps: int) -> str:
    """What a Keras progress bar writes on a terminal: each update steps back over the previous one (backspaces
    and a carriage return) and pads with spaces when it got shorter."""
    text, width = "Epoch 1/2\n", 0
    for step in range(1, steps + 1):
        done = step * 30 // steps
        bar = "━" * done + "─" * (30 - done)
        info = f" - ETA: {steps - step}s - loss: {2.5 / step:.4f}" if step < steps else \
            f" - 2s 20ms/step - loss: {2.5 / step:.4f} - accuracy: 0.9120"
        line = f"{step:3d}/{steps} {bar}{info}"
        text += "\b" * width + "\r" + line + " " * max(0, width - len(line))
        width = len(line)
    return text + "\n"


def test_last_lines_show_each_progress_bar_in_its_final_state():
    last = LastLines(20)
    stream = (keras_progress_bar(100) + "Epoch 2/2\n" + keras_progress_bar(7).split("\n", 1)[1] +
              "saving checkpoint\r\n" + "still running 10%\rstill running 55%").encode()
    for start in range(0, len(stream), 7):  # odd chunks split the multi-byte bar characters too
        last.feed(stream[start:start + 7])
    assert last.tail() == [
        "Epoch 1/2",
        "100/100 " + "━" * 30 + " - 2s 20ms/step - loss: 0.0250 - accuracy: 0.9120",
        "Epoch 2/2",
        "  7/7 " + "━" * 30 + " - 2s 20ms/step - loss: 0.3571 - accuracy: 0.9120",
        "saving checkpoint",
        "still running 55%",
    ]


def test_last_lines_keep_the_newest_and_bound_a_line():
    last = LastLines(3)
    last.feed(b"".join(f"line {i}\n".encode() for i in range(10)) + b"y" * 100_000 + b"\n")
    assert last.tail()[:2] == ["line 8", "line 9"] and len(last.tail()[2]) == 4096


TASK_UID = 2_100_999_000  # the job's user, as the coordinator gives it (an agent that is not root ignores it)


def test_watchdog_byte_count_keeps_growing_past_the_head(tmp_path):
    """A running task's progress (what the heartbeat carries) counts all it wrote, not what the head holds."""
    supervisor = Supervisor(tmp_path, lambda record: None, log_limit_bytes=LIMIT)
    script = "import sys, time\nsys.stdout.write('x' * 400000 + '\\n'); sys.stdout.flush(); time.sleep(60)"
    supervisor.launch(Launch("n", ATTEMPT, (sys.executable, "-c", script), dict(os.environ), "", 0, 1.0,
                             uid=TASK_UID, gid=TASK_UID))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            progress = supervisor.progress()
            if progress and progress[0].output_bytes >= 400001:
                break
            time.sleep(0.05)
        assert progress and progress[0].output_bytes == 400001
    finally:
        supervisor.stop_all(0)
    assert supervisor.running_jobs() == set()


@pytest.mark.parametrize("limit", [MIN_LIMIT_BYTES, 4 << 20])
def test_the_limit_bounds_what_an_attempt_keeps(tmp_path, limit):
    writer = OutputWriter(tmp_path, limit)
    chunk = b"0123456789abcdef" * 4095 + b"\n"
    for _ in range(3 * limit // len(chunk) + 1):
        writer.write(chunk)
    writer.close()
    on_disk = sum(f.stat().st_size for f in tmp_path.iterdir())
    assert 9 * limit // 16 < on_disk <= limit + 5 * 64 * 1024
