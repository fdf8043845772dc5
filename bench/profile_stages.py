"""The stages of the coordinator's work per heartbeat, read from a py-spy profile of the real process: each sample
is put in a stage by the innermost tfcluster frame of the event-loop callback (or thread task) it ran in, or, with
none, in gRPC's own work (the event loop's callbacks into gRPC's core: transport, TLS records, framing, protobuf
parsing). Used by bench/heartbeat_profile.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

# Stages by the path of the innermost tfcluster frame of a sample (the first that matches).
STAGES = (
    # gRPC hands the guard the raw bytes (security.py): each message is decoded there, once within its bound
    ("decoding each message (protobuf, within its bound)", ("Messages.take (tfcluster/security.py",
                                                            "_Reading.read (tfcluster/security.py",
                                                            "_Reading.requests (tfcluster/security.py")),
    ("identity and authorisation", ("tfcluster/security.py", "rpc/listener.py", "rpc/stream_limits.py",
                                    "core/access/", "rpc/join_port.py")),
    ("decoding and checks (wire)", ("tfcluster/wire/",)),
    ("metrics", ("web/metrics.py",)),
    ("store and change log", ("coordinator/store/", "core/model/changelog.py")),
    ("the core's handling", ("coordinator/core/",)),
    ("tfcluster's RPC handlers and replies", ("coordinator/rpc/", "coordinator/grpc_server.py")),
)
GRPC = "gRPC's own work (transport, TLS, framing, parsing)"
OTHER = "other Python (asyncio, logging)"
# Where a thread waits: the event loop in epoll, the store's and executor's threads on their queues.
IDLE_FRAMES = ("selectors.py", "concurrent/futures/thread.py", "threading.py:3", "queue.py")
# Where Python calls into gRPC's core and the sample lands in native code: the event loop's callbacks into
# gRPC (reading and writing messages, TLS records), and the thread that polls gRPC's completion queue.
GRPC_FRAMES = ("Handle._run (asyncio/events.py", "Thread.run (threading.py")

OTHERS: Counter = Counter()  # the innermost frames of the samples put in OTHER, for --show-other


def stage_of(frames: list[str]) -> str | None:
    """The stage of one sampled stack (outermost frame first); None: the thread was waiting."""
    innermost = frames[-1] if frames else ""
    if any(idle in innermost for idle in IDLE_FRAMES):
        return None
    if innermost.startswith(GRPC_FRAMES) or "grpc" in innermost:
        return GRPC
    # The work of one event-loop callback (or thread task): the frames below the last that runs it. Above them
    # are the process's entry frames (the CLI, asyncio.run), which are not a stage.
    runs = [i for i, f in enumerate(frames) if f.startswith(GRPC_FRAMES) or "concurrent/futures/thread.py" in f]
    ours = [f for f in frames[(runs[-1] + 1) if runs else 0:] if "tfcluster/" in f and "tfcluster/api/" not in f]
    if ours:
        for stage, paths in STAGES:
            if any(p in ours[-1] for p in paths):
                return stage
    return OTHER


def split(profile: Path) -> Counter:
    """Busy samples by stage, from py-spy's raw (collapsed stacks) output."""
    stages: Counter = Counter()
    for line in profile.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")[1:]  # the first frame is the thread
        stage = stage_of(frames)
        if stage is not None:
            stages[stage] += int(count)
        if stage == OTHER:
            OTHERS[" <- ".join(reversed(frames[-3:]))] += int(count)
    return stages


def find_py_spy() -> str | None:
    """py-spy (the dev extra) on PATH or beside this Python; None when it is not installed."""
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found if Path(found).exists() else None


def stages_us(py_spy: str, pid: int, seconds: float, out: Path, us_per_heartbeat: float) -> dict[str, float]:
    """Samples process pid for seconds (250 Hz, without pausing it, every thread) and spreads us_per_heartbeat
    over the stages by their shares of the busy samples, largest first."""
    subprocess.run([py_spy, "record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-r", "250",
                    "--nonblocking", "--threads", "-f", "raw", "-o", str(out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stages = split(out)
    busy = sum(stages.values()) or 1
    return {stage: round(samples / busy * us_per_heartbeat, 1) for stage, samples in stages.most_common()}
