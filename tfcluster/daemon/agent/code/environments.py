"""A job's Python environment on a node: a virtualenv built with uv from what the job's [environment] asks for
(a requirements file, or a project's pyproject.toml and uv.lock), once per node for every job that asks for the
same thing.

An environment is named by its key (code/env_request.py): the sha256 of what it is asked to hold, the agent's Python
version, the platform and whether it is isolated, so two jobs that ask for the same packages share one, and a new
Python on the node makes a new one. Files under the agent's state dir, all root's:

    <state>/envs/                  0711 traversable, not listable
    <state>/envs/<key>/            0711
    <state>/envs/<key>/venv/       0755 the virtualenv (the task's PATH starts with its bin); nothing in it is
                                   writable but by root (uv runs with umask 022, and what it made writable
                                   anyway loses those bits before the environment is ready)
    <state>/envs/<key>/request/    0700 the copies of the requirements or project files it was built from (0600)
    <state>/envs/<key>/build.log   0600 uv's output: the agent serves it (`tfcluster logs JOB env --node NAME`)
                                   and a failed build's last lines go with the task's failure
    <state>/envs/<key>/ready       0600 written last: the build finished; without it the build is redone. Its
                                   mtime is when a task last used it: one unused for --retain-for goes
    <state>/envs/<key>.lock        0600 held while the environment is built: one build per key, whoever asks
    <state>/uv-cache/              0700 the node's one uv cache: a package downloaded for one job serves the next
    <state>/jobs/<job>/environment the key of the job's environment here (its log is found by it)

Unless isolated, the environment sees the agent's site-packages (TensorFlow is installed once per node, not per
job). The agent's UV_INDEX_URL and UV_FIND_LINKS apply to every build (air-gapped sites serve their own index),
and are its only sources: a job's files may name none of their own (code/request_rules.py). UV_NO_INDEX=1 keeps builds
to the find-links alone.
As root the agent installs wheels only: building a source distribution runs its code, as root.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import site
import stat
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

from tfcluster import layout
from tfcluster.daemon.agent.code.env_request import EnvironmentProblem, Request, environment_key, read_request
from tfcluster.daemon.agent.code.request_rules import PYPI
from tfcluster.daemon.agent.tasks.users import TaskUser
from tfcluster.model import EnvironmentSpec

UV_CACHE_DIR = "uv-cache"
JOB_ENVIRONMENT_FILE = "environment"
READY_FILE = "ready"
LOG_FILE = "build.log"
PASSAGE_MODE = 0o711  # envs/ and envs/<key>/: a task reaches its venv by its path, and lists nothing
PRIVATE_DIR_MODE = 0o700  # the request copies, the uv cache: the agent's alone
PRIVATE_FILE_MODE = 0o600  # the request copies, the build log, the ready and lock files
UV_UMASK = 0o022  # what uv makes (the venv) every job's tasks read, and only root writes
FAILURE_LINES = 20
KEY_RE = re.compile(r"[0-9a-f]{64}")


def uv_binary() -> str:
    """The uv installed with tfcluster (a pinned dependency), else one on PATH."""
    try:
        from uv import find_uv_bin
        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv") or "uv"


def task_environment(venv: Path, env: dict[str, str]) -> dict[str, str]:
    """The task's environment with the job's environment first on PATH, as `source venv/bin/activate` does."""
    out = {k: v for k, v in env.items() if k != "PYTHONHOME"}
    path = env.get("PATH") or os.defpath
    return {**out, "PATH": f"{venv / 'bin'}{os.pathsep}{path}", "VIRTUAL_ENV": str(venv)}


class Environments:
    """The node's job environments: found when built, else built once (whoever else asks waits for that build)."""

    def __init__(self, state_dir: str | Path, uv: str = "", index_url: str = "", find_links: str = ""):
        self.state_dir = Path(state_dir)
        self.root = layout.environments_dir(self.state_dir)
        self.uv = uv or uv_binary()
        self.python = sys.executable  # the agent's own: the key's Python version and platform are its
        # The agent's flags win over its environment; both reach uv as its own variables.
        self.index_url = index_url or os.environ.get("UV_INDEX_URL", "")
        self.find_links = find_links or os.environ.get("UV_FIND_LINKS", "")
        # uv reads no UV_NO_INDEX of its own for `pip install` and `sync`: without --no-index an air-gapped node
        # with only find-links asks PyPI first, and waits out uv's timeouts and retries before it fails.
        self.no_index = os.environ.get("UV_NO_INDEX", "").strip().lower() in ("1", "true", "yes", "on")

    def venv(self, key: str) -> Path:
        return self.root / key / "venv"

    def indexes(self) -> tuple[str, ...]:
        """The package indexes the operator gave this node's builds (none with UV_NO_INDEX): a project's uv.lock
        may name no other."""
        if self.no_index:
            return ()
        default = self.index_url or os.environ.get("UV_DEFAULT_INDEX", "") or PYPI
        return (default, *os.environ.get("UV_EXTRA_INDEX_URL", "").split())

    def prepare(self, job_id: str, spec: EnvironmentSpec, workdir: str, user: TaskUser) -> Path:
        """The job's environment on this node, built first when it is not yet; its files are read as user, the
        task's. Raises EnvironmentProblem."""
        request = read_request(spec, workdir, user, self.indexes())
        key = environment_key(request)
        self._remember(job_id, key)
        directory = self.root / key
        with self._locked(key):  # held a moment when it is built: a sweep never removes it under this task
            if not (directory / READY_FILE).exists():  # built meanwhile by whoever held the lock
                self._build(directory, request)
            os.utime(directory / READY_FILE)
        return directory / "venv"

    def sweep(self, jobs_in_use: set[str], now: float, unused_for: float) -> list[str]:
        """Removes the environments no job in use here names and no task has used for unused_for seconds (and
        what crashed builds left as long ago); one being built or used at this moment is skipped. Returns the
        keys removed."""
        in_use = {self._key_of(job_id) for job_id in jobs_in_use}
        removed = []
        _set_mode(self.root, PASSAGE_MODE)  # as an earlier agent may have left them
        _set_mode(self.state_dir / UV_CACHE_DIR, PRIVATE_DIR_MODE)
        for directory in self.root.iterdir() if self.root.is_dir() else ():
            key = directory.name
            if not KEY_RE.fullmatch(key):
                continue
            if key in in_use or _last_used(directory) > now - unused_for:
                _make_private(directory)
                continue
            lock = _FileLock(self.root / f"{key}.lock", wait=False)
            with lock:
                if not lock.held or _last_used(directory) > now - unused_for:  # building, or used meanwhile
                    continue
                shutil.rmtree(directory, ignore_errors=True)
                lock.path.unlink(missing_ok=True)  # whoever waits on it takes the lock again (_FileLock)
            removed.append(key)
        return removed

    def _key_of(self, job_id: str) -> str:
        try:
            return (layout.job_dir(self.state_dir, job_id) / JOB_ENVIRONMENT_FILE).read_text().strip()
        except OSError:
            return ""

    def log_path(self, job_id: str) -> Path | None:
        """The build log of the job's environment on this node; None when the job asked for none here."""
        key = self._key_of(job_id)
        return self.root / key / LOG_FILE if KEY_RE.fullmatch(key) else None

    def building(self, log: Path) -> bool:
        """Whether the build that writes this log is under way (someone holds its lock)."""
        try:
            fd = os.open(self.root / f"{log.parent.name}.lock", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def _remember(self, job_id: str, key: str) -> None:
        path = layout.job_dir(self.state_dir, job_id)
        path.mkdir(parents=True, exist_ok=True)
        temporary = path / f".{JOB_ENVIRONMENT_FILE}.{threading.get_ident()}"
        temporary.write_text(key + "\n")
        os.replace(temporary, path / JOB_ENVIRONMENT_FILE)

    def _locked(self, key: str):
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, PASSAGE_MODE)
        return _FileLock(self.root / f"{key}.lock")

    def _build(self, directory: Path, request: Request) -> None:
        """A fresh build: whatever a crashed one left is removed first; the ready file is written last."""
        venv, sources = directory / "venv", directory / "request"
        for leftover in (venv, sources):
            shutil.rmtree(leftover, ignore_errors=True)
        directory.mkdir(mode=PASSAGE_MODE, exist_ok=True)
        os.chmod(directory, PASSAGE_MODE)
        sources.mkdir(mode=PRIVATE_DIR_MODE)
        for name, content in request.files:
            _write_new(sources / name, content, PRIVATE_FILE_MODE)
        cache = self.state_dir / UV_CACHE_DIR
        cache.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
        os.chmod(cache, PRIVATE_DIR_MODE)
        with open(directory / LOG_FILE, "wb", buffering=0) as log:
            os.fchmod(log.fileno(), PRIVATE_FILE_MODE)
            self._run(log, self._venv_command(venv, request.isolated))
            if not request.isolated:
                self._see_agent_packages(venv)
            self._run(log, self._install_command(venv, sources, request), project_env=venv if request.project else None)
            log.write(b"environment ready\n")
        _seal(venv)
        _write_new(directory / READY_FILE, b"", PRIVATE_FILE_MODE)

    def _venv_command(self, venv: Path, isolated: bool) -> list[str]:
        return [self.uv, "venv", "--python", self.python, *([] if isolated else ["--system-site-packages"]), str(venv)]

    def _install_command(self, venv: Path, sources: Path, request: Request) -> list[str]:
        # As root, wheels only: a source distribution's build runs its own code.
        limits = ["--no-build"] if os.geteuid() == 0 else []
        limits += ["--no-index"] if self.no_index else []
        if request.project:
            frozen = ["--frozen"] if (sources / "uv.lock").exists() else []
            return [self.uv, "sync", "--project", str(sources), "--no-install-project", *frozen, *limits]
        return [self.uv, "pip", "install", "--python", str(venv / "bin" / "python"), "-r",
                str(sources / "requirements.txt"), *limits]

    def _see_agent_packages(self, venv: Path) -> None:
        """--system-site-packages shows the base interpreter's packages; an agent run from a virtualenv has its own
        (TensorFlow among them): a .pth file adds them after the environment's own."""
        if sys.prefix == sys.base_prefix:
            return
        site_packages = next(venv.glob("lib/python*/site-packages"))
        _write_new(site_packages / "_tfcluster_agent.pth", "".join(f"{p}\n" for p in site.getsitepackages()).encode(),
                   0o644)

    def _uv_environment(self, project_env: Path | None) -> dict[str, str]:
        # The agent's own UV_* settings stay (UV_NO_INDEX, UV_EXTRA_INDEX_URL...: the site's configuration).
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
        env.update(UV_CACHE_DIR=str(self.state_dir / UV_CACHE_DIR), UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1",
                   UV_PYTHON=self.python)
        if self.index_url:
            env["UV_INDEX_URL"] = self.index_url
        if self.find_links:
            env["UV_FIND_LINKS"] = self.find_links
        if project_env is not None:
            env["UV_PROJECT_ENVIRONMENT"] = str(project_env)
        return env

    def _run(self, log, command: list[str], project_env: Path | None = None) -> None:
        log.write(f"$ {' '.join(command)}\n".encode())
        try:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, env=self._uv_environment(project_env),
                                       umask=UV_UMASK)
        except OSError as e:
            raise EnvironmentProblem(f"cannot run uv ({command[0]}): {e.strerror or e}") from None
        last: deque[str] = deque(maxlen=FAILURE_LINES)
        for line in process.stdout:
            log.write(line)
            if line.strip():
                last.append(line.decode(errors="replace").rstrip())
        code = process.wait()
        if code != 0:
            log.write(f"uv exited with {code}\n".encode())
            shown = "; ".join(list(last)[-3:])
            raise EnvironmentProblem(f"building the job's environment failed (uv {command[1]} exited with {code}): "
                                    f"{shown}", tuple(last))


def _write_new(path: Path, content: bytes, mode: int) -> None:
    """A file made anew with mode (whatever the agent's umask), never written through a link."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, content)
    finally:
        os.close(fd)


def _seal(venv: Path) -> None:
    """Takes the group's and others' write bits off everything in the venv: uv makes some files whatever its
    umask (its venv's .lock is 0666), and every job that uses the environment must find it as it was built."""
    for directory, dirs, files in os.walk(venv):
        for name in (*dirs, *files):
            path = os.path.join(directory, name)
            found = os.lstat(path)
            if not stat.S_ISLNK(found.st_mode) and found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                os.chmod(path, stat.S_IMODE(found.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))


def _make_private(directory: Path) -> None:
    """Sets the modes above on an environment an earlier agent made, whose request copies, build log and lock
    every user could open (only the agent writes under envs/: no path here is a job's)."""
    paths = [(directory, PASSAGE_MODE), (directory / "request", PRIVATE_DIR_MODE),
             (directory / LOG_FILE, PRIVATE_FILE_MODE), (directory / READY_FILE, PRIVATE_FILE_MODE),
             (directory.with_name(f"{directory.name}.lock"), PRIVATE_FILE_MODE)]
    paths += [(copy, PRIVATE_FILE_MODE) for copy in (directory / "request").glob("*")]
    for path, mode in paths:
        _set_mode(path, mode)


def _set_mode(path: Path, mode: int) -> None:
    try:
        if stat.S_IMODE(path.stat().st_mode) != mode:
            os.chmod(path, mode)
    except FileNotFoundError:
        pass  # removed meanwhile, or never made (a crashed build)


def _last_used(directory: Path) -> float:
    """When a task last used the environment (its ready file), or when its unfinished build was begun."""
    for path in (directory / READY_FILE, directory):
        try:
            return path.stat().st_mtime
        except FileNotFoundError:
            continue
    return float("inf")  # removed meanwhile: nothing to do


class _FileLock:
    """An exclusive flock on a file, across threads (each opens its own description) and processes. A lock file
    removed by a sweep while someone waited on it is opened again, so two builders never hold different files.
    With wait=False it is taken only when free (`held` says whether)."""

    def __init__(self, path: Path, wait: bool = True):
        self.path, self.wait = path, wait
        self.fd, self.held = -1, False

    def __enter__(self) -> _FileLock:
        while True:
            # 0600: a task that could open it could hold a lock on it, and keep every build of that key waiting.
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
            except BlockingIOError:
                return self
            try:
                if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                    self.held = True
                    return self
            except FileNotFoundError:
                pass
            os.close(self.fd)

    def __exit__(self, *exc) -> None:
        os.close(self.fd)
