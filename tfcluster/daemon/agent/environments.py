"""A job's Python environment on a node: a virtualenv built with uv from what the job's [environment] asks for
(a requirements file, or a project's pyproject.toml and uv.lock), once per node for every job that asks for the
same thing.

An environment is named by its key: the sha256 of what it is asked to hold, the agent's Python version, the
platform and whether it is isolated, so two jobs that ask for the same packages share one, and a new Python on
the node makes a new one. Files under the agent's state dir:

    <state>/envs/<key>/venv/       the virtualenv (the task's PATH starts with its bin)
    <state>/envs/<key>/request/    the copies of the requirements or project files it was built from
    <state>/envs/<key>/build.log   uv's output (`tfcluster logs JOB env --node NAME`)
    <state>/envs/<key>/ready       written last: the build finished; without it the build is redone. Its
                                   mtime is when a task last used it: one unused for --retain-for goes
    <state>/envs/<key>.lock        held while the environment is built: one build per key, whoever asks
    <state>/uv-cache/              the node's one uv cache: a package downloaded for one job serves the next
    <state>/jobs/<job>/environment the key of the job's environment here (its log is found by it)

Unless isolated, the environment sees the agent's site-packages (TensorFlow is installed once per node, not per
job). The agent's UV_INDEX_URL and UV_FIND_LINKS apply to every build (air-gapped sites serve their own index),
and UV_NO_INDEX=1 keeps builds to the find-links alone.
As root the agent installs wheels only: building a source distribution runs its code, as root.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from tfcluster import layout
from tfcluster.model import EnvironmentSpec

ENVS_DIR = "envs"
UV_CACHE_DIR = "uv-cache"
JOB_ENVIRONMENT_FILE = "environment"
READY_FILE = "ready"
LOG_FILE = "build.log"
DIR_MODE = 0o755  # the tasks of every job that uses it read it; only the agent writes it
MAX_REQUEST_BYTES = 1 << 20
FAILURE_LINES = 20
KEY_RE = re.compile(r"[0-9a-f]{64}")
# Lines that make uv read another file: the key would not cover it, and the agent (root) would read it.
_INCLUDES = re.compile(r"^\s*(-r|-c|-e|--requirement|--constraint|--editable)(\s|=|$)")


class EnvironmentProblem(Exception):
    """The job's environment cannot be had; the message says why (the resolver's own lines, for a failed build)."""

    def __init__(self, message: str, log_tail: tuple[str, ...] = ()):
        super().__init__(message)
        self.log_tail = log_tail



@dataclass(frozen=True)
class Request:
    """What a job's environment is built from: the files' names and contents, and whether it is isolated."""
    files: tuple[tuple[str, bytes], ...]
    isolated: bool

    @property
    def project(self) -> bool:
        return any(name == "pyproject.toml" for name, _ in self.files)


def platform_tag() -> str:
    """What a built environment depends on besides its files: the interpreter and the platform."""
    v = sys.version_info
    return f"{sys.implementation.name}-{v.major}.{v.minor}.{v.micro}-{sysconfig.get_platform()}"


def environment_key(request: Request, python: str | None = None) -> str:
    """sha256 over every input of a build, each length-prefixed so no two different inputs run together."""
    h = hashlib.sha256()
    parts = [b"tfcluster-environment-1", (python or platform_tag()).encode(), b"isolated" if request.isolated else b"shared"]
    for name, content in request.files:
        parts += [name.encode(), content]
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def read_request(spec: EnvironmentSpec, workdir: str) -> Request:
    """The files the spec names, read from the workdir; they must stay inside it (the agent reads them as root)."""
    if spec.requirements:
        content = _read_inside(workdir, spec.requirements)
        for number, line in enumerate(content.decode(errors="replace").splitlines(), 1):
            if _INCLUDES.match(line):
                raise EnvironmentProblem(f"{spec.requirements}:{number}: {line.strip()!r}: requirements that name other "
                                        f"files (-r, -c, -e) are not supported; list the packages in this file")
        return Request((("requirements.txt", content),), spec.isolated)
    directory = spec.project or "."
    files = [("pyproject.toml", _read_inside(workdir, os.path.join(directory, "pyproject.toml")))]
    lock = os.path.join(directory, "uv.lock")
    if os.path.exists(os.path.join(workdir, lock)):
        files.append(("uv.lock", _read_inside(workdir, lock)))
    return Request(tuple(files), spec.isolated)


def _read_inside(workdir: str, relative: str) -> bytes:
    root = os.path.realpath(workdir or ".")
    path = os.path.realpath(os.path.join(root, relative))
    if os.path.commonpath([root, path]) != root:
        raise EnvironmentProblem(f"{relative}: leaves the workdir {workdir}")
    try:
        with open(path, "rb") as f:
            content = f.read(MAX_REQUEST_BYTES + 1)
    except OSError as e:
        raise EnvironmentProblem(f"cannot read {relative} in the workdir {workdir}: {e.strerror or e}") from None
    if len(content) > MAX_REQUEST_BYTES:
        raise EnvironmentProblem(f"{relative}: larger than {MAX_REQUEST_BYTES >> 20} MiB")
    return content


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
        self.root = self.state_dir / ENVS_DIR
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

    def prepare(self, job_id: str, spec: EnvironmentSpec, workdir: str) -> Path:
        """The job's environment on this node, built first when it is not yet; raises EnvironmentProblem."""
        request = read_request(spec, workdir)
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
        for directory in self.root.iterdir() if self.root.is_dir() else ():
            key = directory.name
            if not KEY_RE.fullmatch(key) or key in in_use or _last_used(directory) > now - unused_for:
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
        os.chmod(self.root, DIR_MODE)
        return _FileLock(self.root / f"{key}.lock")

    def _build(self, directory: Path, request: Request) -> None:
        """A fresh build: whatever a crashed one left is removed first; the ready file is written last."""
        venv, sources = directory / "venv", directory / "request"
        for leftover in (venv, sources):
            shutil.rmtree(leftover, ignore_errors=True)
        sources.mkdir(parents=True, mode=DIR_MODE)
        os.chmod(directory, DIR_MODE)
        for name, content in request.files:
            (sources / name).write_bytes(content)
        with open(directory / LOG_FILE, "wb", buffering=0) as log:
            os.fchmod(log.fileno(), 0o644)
            self._run(log, self._venv_command(venv, request.isolated))
            if not request.isolated:
                self._see_agent_packages(venv)
            self._run(log, self._install_command(venv, sources, request), project_env=venv if request.project else None)
            log.write(b"environment ready\n")
        (directory / READY_FILE).write_text("")

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
        (site_packages / "_tfcluster_agent.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))

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
                                       stderr=subprocess.STDOUT, env=self._uv_environment(project_env))
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
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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
