"""The per-task shim: forked by the agent's launcher (launcher.py) with this module already imported (a forked shim
whose task ended cleanly runs the next attempt it is given: tasks/forked_shim.py), or started as
`python -m tfcluster.daemon.agent.shim.runner ATTEMPT_DIR` when the launcher cannot serve.

It starts the task in its own process group, copies its output into the attempt's output files (within
the attempt's limit: the head and the newest bytes, tasklog.py), carries out stops (the job's stop signal,
SIGTERM unless its spec names another, then SIGKILL to the whole group once the grace period is over), kills whatever the task leaves behind in its group, and
records how the task ended, with its last lines, in its status file. Because the shim, not the agent, is
the task's parent, an agent restart loses nothing: the exit code and the log are still recorded, and the
new agent picks them up from the attempt dir; and nothing the task started outlives it.

Files in ATTEMPT_DIR (names in tfcluster.layout, contents in taskfiles.py): the launch file (written by the
agent), the status file (written here, atomically), the output files (the task's stdout and stderr), and the
stop file (the grace period of the latest stop request). A second stop with a shorter grace shortens the wait.

The shim stays root (it kills the group, writes the status); the task runs as the job's user, with a private
/tmp and no way to gain privileges (isolation.py), when the launch file names a user.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from tfcluster import layout
from tfcluster.daemon.agent.shim import cgroups, isolation, spawn, threads
from tfcluster.daemon.agent.shim.taskfiles import LaunchFile, ShimStatus, UsageFile, read_stop_grace
from tfcluster.daemon.agent.shim.tasklog import DEFAULT_LIMIT_BYTES, LastLines, OutputWriter
from tfcluster.daemon.agent.shim.treewatch import TreeWatch, Usage, exceeded_message
from tfcluster.model import TaskExit
from tfcluster.states import Phase
TAIL_LINES = 20
PUMP_CHUNK_BYTES = 64 << 10
ESCALATION_POLL_SECONDS = 0.1
DRAIN_SECONDS = 5.0  # how long the output is read on after the task exited and its group was killed
# The watch of the task's tree starts this long after the task: a task that ends sooner (most short tasks) costs
# no thread, and its figures come from the kernel's accounting of it alone. No later than the watch's own
# fastest pace; a cgroup, where there is one, keeps the memory limit from the start.
WATCH_AFTER_SECONDS = 0.1


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
        launch = LaunchFile.read(attempt_dir)
        if launch is None:
            raise FileNotFoundError(f"{attempt_dir / layout.LAUNCH_FILE}: no launch file")
        self.launch = launch
        self.last_lines = LastLines(TAIL_LINES)
        # Set by the SIGTERM handler, which runs in this (the main) thread. Threads are started only when needed (a
        # task still running after WATCH_AFTER_SECONDS, a stop's escalation): a shim the launcher forks imports
        # no threading, whose at-fork hook would otherwise run in each one.
        self.stopping = False
        self.kill_at = float("inf")  # monotonic time of the SIGKILL, once a stop was asked for
        self.child: spawn.TaskProcess | None = None
        self.private_tmp = False  # /tmp is the job's own dir here
        self.host_mounts = -1  # with a private /tmp: the mount namespace the shim came from (leave_private_tmp)
        self.cgroup = ""  # the task's cgroup it was started in, which keeps its memory limit; "": none does
        self.output_writable = True  # until writing the output failed (a full disk)
        self.started = process_start(os.getpid())

    def status(self, phase: str, **fields) -> None:
        ShimStatus(phase, attempt=self.launch.attempt.number, shim_pid=os.getpid(), shim_started=self.started,
                   **fields).write(self.dir)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        uid, gid, groups = self.launch.uid, self.launch.gid, list(self.launch.groups)
        file_group = self.launch.file_group
        log = OutputWriter(self.dir, self.launch.log_limit_bytes or DEFAULT_LIMIT_BYTES,
                           group=-1 if file_group is None else file_group)
        env = self._isolate(log)
        home = self._enter_cgroup(log)
        try:
            with isolation.acting_as(uid, gid, groups):
                isolation.check_workdir(self.launch.workdir, isolation.task_user(uid))
                isolation.make_task_dirs(list(self.launch.task_dirs), isolation.task_user(uid))
            with spawn.keeping_cwd(), isolation.starting_as(uid, gid, groups):
                self.child = spawn.start(self.launch.command, self.launch.workdir, env)
        except (OSError, ValueError, isolation.StartRefused) as e:
            exit = self._start_failure(e, env)
            log.write(f"tfcluster: {exit.message}\n".encode())
            self.status(Phase.FAILED_TO_START, finished=time.time(), exit=exit)
            print(json.dumps({"phase": Phase.FAILED_TO_START}), flush=True)
            return 0
        finally:
            if home is not None:
                cgroups.leave(home)  # the task, forked meanwhile, stays in; the shim's memory is not the task's
        pid = self.child.pid
        started = time.time()
        self.status(Phase.RUNNING, pid=pid, pgid=pid, started=started)
        print(json.dumps({"phase": Phase.RUNNING, "pid": pid}), flush=True)
        if self.stopping:  # a stop that raced the start
            self._terminate()
        # With a cgroup the kernel keeps the limit; the watch measures all the same.
        watch = TreeWatch(pid, 0 if self.cgroup else self.launch.memory_bytes, self._publish)
        returncode, usage = self._follow(log, watch)
        log.close()
        exit = self._exit(returncode, usage, watch.exceeded)
        self.status(Phase.EXITED, pid=pid, pgid=pid, started=started, finished=time.time(),
                    stopped=self.stopping, exit=exit)
        return 0

    def _exit(self, returncode: int, usage: Usage, exceeded: bool) -> TaskExit:
        """How the task ended, with what it used, and why when it was killed for its memory."""
        peak = usage.peak_rss_bytes
        if self.cgroup:
            exceeded, peak = cgroups.oom_kills(self.cgroup) > 0, max(peak, cgroups.peak_bytes(self.cgroup))
            cgroups.remove(self.cgroup)
        exit = TaskExit.of_returncode(returncode, tuple(self.last_lines.tail()))
        exit = replace(exit, cpu_seconds=usage.cpu_seconds, peak_rss_bytes=peak)
        if exceeded:
            exit = replace(exit, message=exceeded_message(self.launch.attempt.task_key, self.launch.memory_bytes, peak))
        return exit

    def _enter_cgroup(self, log: OutputWriter):
        """Steps into the task's cgroup (when its agent made one) for the task to start there; returns the cgroup
        to step back to, None when there is none."""
        if not self.launch.cgroup:
            return None
        try:
            home = cgroups.enter(self.launch.cgroup)
        except OSError as e:
            log.write(f"tfcluster: cannot start the task in its cgroup {self.launch.cgroup} ({e.strerror or e}); "
                      f"its memory limit is kept by watching its processes\n".encode())
            return None
        self.cgroup = self.launch.cgroup
        return home

    def _publish(self, usage: Usage) -> None:
        """The running task's figures, for its agent's heartbeats."""
        try:
            UsageFile(usage.cpu_seconds, usage.rss_bytes, usage.peak_rss_bytes).write(self.dir)
        except OSError as e:  # a full disk: the task runs on; its figures are in its exit all the same
            print(f"cannot record the task's usage: {e}", file=sys.stderr, flush=True)

    def _isolate(self, log: OutputWriter) -> dict[str, str]:
        """No new privileges for the task, and a private /tmp when the launch asks for one (the shim is root);
        the task's environment, with TMPDIR where its temporary files go."""
        env = dict(self.launch.env)
        if self.launch.uid is not None:
            isolation.no_new_privileges()
        tmp = self.launch.private_tmp
        if tmp:
            why = self.launch.private_tmp_unavailable or self._enter_private_tmp(tmp)
            if why:
                log.write(f"tfcluster: this job has no private /tmp on this node ({why}); its temporary files "
                          f"go to TMPDIR={tmp}, and fixed /tmp paths are shared with other jobs\n".encode())
            else:
                self.private_tmp = True
                if env.get("TMPDIR") == tmp:  # unless the spec set its own
                    env["TMPDIR"] = "/tmp"
        return env

    def _enter_private_tmp(self, tmp: str) -> str:
        try:
            self.host_mounts = isolation.mount_namespace()
        except OSError as e:  # no /proc: the private /tmp works all the same, and this shim runs no other task
            print(f"cannot keep the shim's mount namespace: {e}", file=sys.stderr, flush=True)
        return isolation.private_tmp(tmp)

    def leave_private_tmp(self) -> bool:
        """Back in the mount namespace the shim came from, its private /tmp left behind; False when it cannot
        come back (it then runs no other task)."""
        namespace, self.host_mounts = self.host_mounts, -1
        if namespace == -1:  # it never kept one: back only if it never left
            return not self.private_tmp
        try:
            isolation.enter_mount_namespace(namespace)
            return True
        except OSError as e:
            print(f"cannot leave the task's private /tmp: {e}", file=sys.stderr, flush=True)
            return False
        finally:
            os.close(namespace)

    def _start_failure(self, error: Exception, env: dict[str, str]) -> TaskExit:
        """Why the task did not start, and whether a restart could change that (permanent: it cannot)."""
        if isinstance(error, isolation.StartRefused):
            return TaskExit(message=str(error), permanent=True)
        if isinstance(error, ValueError):
            return TaskExit(message=f"cannot start the command: {error}", permanent=True)
        program = self.launch.command[0]
        message = f"cannot start command {error.filename or program!r}: {error.strerror or error}"
        permanent = error.errno in isolation.PERMANENT_EXEC_ERRORS
        if permanent:
            uid, gid, groups = self.launch.uid, self.launch.gid, list(self.launch.groups)
            with isolation.acting_as(uid, gid, groups):
                why = isolation.explain_exec_failure(program, env.get("PATH", os.defpath), self.launch.workdir,
                                                     isolation.task_user(uid))
            message += f"; {why}" if why else ""
        if self.private_tmp and str(error.filename or "").startswith("/tmp/"):
            message += " (this job's /tmp is its own: keep programs and data outside /tmp)"
        return TaskExit(message=message, permanent=permanent)

    def _follow(self, log: OutputWriter, watch: TreeWatch) -> tuple[int, Usage]:
        """Copies the task's output until it exits, measures what it used, kills whatever it left in its group
        (workers of a data loader, a daemonised helper), copies what is left of its output, and returns its
        returncode and usage. In this thread, watching its pidfd: a thread of its own for the output was a tenth
        of a short task's CPU."""
        try:
            exited = os.pidfd_open(self.child.pid)
        except (AttributeError, OSError):  # before Linux 5.3
            return self._follow_with_thread(log, watch)
        try:
            if not self._copy_output(log, until=exited, deadline=time.monotonic() + WATCH_AFTER_SECONDS):
                watch.start()  # still running
                self._copy_output(log, until=exited)
            returncode = self.child.wait()
            usage = self._ended(watch)
            # Bounded: a process outside the group may hold the pipe open.
            self._copy_output(log, deadline=time.monotonic() + DRAIN_SECONDS)
        finally:
            os.close(exited)
            self.child.stdout.close()  # held open past the drain: let go of it (a shim may run another task)
        return returncode, usage

    def _follow_with_thread(self, log: OutputWriter, watch: TreeWatch) -> tuple[int, Usage]:
        watch.start()
        pump = threads.start(self._copy_output, "output", log)
        returncode = self.child.wait()
        usage = self._ended(watch)
        pump.join(timeout=DRAIN_SECONDS)
        return returncode, usage

    def _ended(self, watch: TreeWatch) -> Usage:
        """The task exited: what its tree used, read before what it left in its group is killed."""
        usage = watch.finish(self.child.rusage)
        (self.dir / layout.USAGE_FILE).unlink(missing_ok=True)  # the running figures: the exit has the final ones
        kill_group(self.child.pid, signal.SIGKILL)
        return usage

    def _copy_output(self, log: OutputWriter, until: int = -1, deadline: float = float("inf")) -> bool:
        """Copies the output until the `until` descriptor (a pidfd) is readable, or the deadline, or (without
        `until`) to the end. True when `until` became readable: the task exited."""
        pipe = self.child.stdout
        while True:
            watched = [*([] if pipe.closed else [pipe]), *([until] if until != -1 else [])]
            if not watched:
                return False
            ready, _, _ = select.select(watched, [], [],
                                        None if deadline == float("inf") else max(0.0, deadline - time.monotonic()))
            if pipe in ready:
                data = os.read(pipe.fileno(), PUMP_CHUNK_BYTES)
                if data:
                    self._keep(data, log)
                else:
                    pipe.close()  # the output ended (the task closed it): the task's exit is next
            elif until in ready:
                return True
            elif not ready:  # time is up
                return False

    def _keep(self, data: bytes, log: OutputWriter) -> None:
        if self.output_writable:
            try:
                log.write(data)
            except OSError as e:
                # A full disk: the task must not block on a pipe nobody drains, so reading goes on.
                print(f"writing the task's output failed, the rest is not kept: {e}", file=sys.stderr, flush=True)
                self.output_writable = False
        self.last_lines.feed(data)

    def _on_term(self, signum, frame) -> None:
        first = not self.stopping
        self.stopping = True
        if self.child is not None:
            self._terminate(first)

    def _grace(self) -> float:
        try:
            grace = read_stop_grace(self.dir)
        except ValueError as e:
            print(f"ignoring the stop file: {e}", file=sys.stderr, flush=True)
            grace = None
        return self.launch.stop_grace_seconds if grace is None else grace

    def _terminate(self, first: bool = True) -> None:
        """The launch's stop signal (SIGTERM unless the spec says otherwise) to the group now (the first time),
        SIGKILL once the grace period is over."""
        pgid = self.child.pid
        self.kill_at = min(self.kill_at, time.monotonic() + self._grace())
        if time.monotonic() >= self.kill_at:
            kill_group(pgid, signal.SIGKILL)
            return
        if not first:
            return  # the escalation thread already waits; it now waits for the new, earlier time
        kill_group(pgid, signal.Signals[self.launch.stop_signal])

        def escalate() -> None:
            while time.monotonic() < self.kill_at:
                # Set by the main thread's wait: only it reaps the task, whose pid its pidfd must still name.
                if self.child.returncode is not None and not group_alive(pgid):
                    return
                time.sleep(ESCALATION_POLL_SECONDS)
            kill_group(pgid, signal.SIGKILL)
        threads.start(escalate, "stop-escalation")


def process_start(pid: int) -> int:
    """When the process started, in clock ticks since boot (field 22 of /proc/PID/stat); 0: it is gone (or a
    zombie). The pid and this name one process for good: a reused pid comes with another start time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    # The command name (field 2, in parentheses) may hold spaces or parentheses: count after its end.
    fields = stat[stat.rindex(b")") + 2:].split()
    return 0 if fields[0] == b"Z" else int(fields[19])


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m tfcluster.daemon.agent.shim.runner ATTEMPT_DIR", file=sys.stderr)
        return 2
    return Runner(Path(sys.argv[1])).run()


if __name__ == "__main__":
    sys.exit(main())
