"""The per-task shim: `python -m tfcluster.daemon.agent.taskrunner ATTEMPT_DIR`.

It starts the task in its own process group, copies its output line by line into the attempt's log
file, forwards a stop (SIGTERM, then SIGKILL to the whole group after the grace period), kills whatever
the task leaves behind in its group, and records how the task ended in status.json. Because the shim,
not the agent, is the task's parent, an agent restart loses nothing: the exit code and the log are
still recorded, and the new agent picks them up from the attempt dir (LESSONS.md 7, 9).

Files in ATTEMPT_DIR: launch.json (written by the agent), status.json (written here, atomically),
output.log (the task's stdout and stderr as written), stop.json (optional, the stop's grace period).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

TAIL_LINES = 20


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def kill_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def group_alive(pgid: int) -> bool:
    return kill_group(pgid, 0)


class Runner:
    def __init__(self, attempt_dir: Path):
        self.dir = attempt_dir
        self.launch = json.loads((attempt_dir / "launch.json").read_text())
        self.status_path = attempt_dir / "status.json"
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.stopping = threading.Event()
        self.child: subprocess.Popen | None = None

    def status(self, **fields) -> None:
        write_json_atomic(self.status_path, {"shim_pid": os.getpid(), "attempt": self.launch["attempt"], **fields})

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        log = open(self.dir / "output.log", "ab", buffering=0)
        try:
            self.child = subprocess.Popen(self.launch["command"], cwd=self.launch["workdir"] or None,
                                          env=self.launch["env"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            what = "working directory" if e.filename == self.launch["workdir"] else "command"
            message = f"cannot start {what} {e.filename or self.launch['command'][0]!r}: {e.strerror or e}"
            log.write(f"tfcluster: {message}\n".encode())
            self.status(phase="FAILED_TO_START", message=message, finished=time.time())
            print(json.dumps({"phase": "FAILED_TO_START"}), flush=True)
            return 0
        pid = self.child.pid
        started = time.time()
        self.status(phase="RUNNING", pid=pid, pgid=pid, started=started)
        print(json.dumps({"phase": "RUNNING", "pid": pid}), flush=True)
        if self.stopping.is_set():  # a stop that raced the start
            self._terminate()
        pump = threading.Thread(target=self._pump, args=(self.child.stdout, log), daemon=True)
        pump.start()
        returncode = self.child.wait()
        # Whatever the task left in its group (workers of a data loader, a daemonised helper) goes too.
        kill_group(pid, signal.SIGKILL)
        pump.join(timeout=5)
        log.close()
        fields = {"phase": "EXITED", "pid": pid, "pgid": pid, "started": started, "finished": time.time(),
                  "log_tail": list(self.tail), "stopped": self.stopping.is_set()}
        if returncode < 0:
            fields["signal"] = -returncode
        else:
            fields["exit_code"] = returncode
        self.status(**fields)
        return 0

    def _pump(self, pipe, log) -> None:
        for line in iter(pipe.readline, b""):
            log.write(line)
            self.tail.append(line.decode(errors="replace").rstrip("\n"))
        pipe.close()

    def _on_term(self, signum, frame) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        if self.child is not None:
            self._terminate()

    def _terminate(self) -> None:
        grace = float(self.launch.get("stop_grace_seconds", 30.0))
        try:
            grace = float(json.loads((self.dir / "stop.json").read_text())["grace_seconds"])
        except (OSError, ValueError, KeyError):
            pass
        pgid = self.child.pid
        if grace <= 0:
            kill_group(pgid, signal.SIGKILL)
            return
        kill_group(pgid, signal.SIGTERM)

        def escalate() -> None:
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if self.child.poll() is not None and not group_alive(pgid):
                    return
                time.sleep(0.1)
            kill_group(pgid, signal.SIGKILL)
        threading.Thread(target=escalate, daemon=True).start()


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m tfcluster.daemon.agent.taskrunner ATTEMPT_DIR", file=sys.stderr)
        return 2
    return Runner(Path(sys.argv[1])).run()


if __name__ == "__main__":
    sys.exit(main())
