"""What a job's environment is built from: the files its [environment] names, read from the job's workdir as the
job's task user would read them (code/request_files.py) and refused when they ask for more than packages from the
operator's index (code/request_rules.py), and the key they give the environment (environments.py builds it). A job can
neither make the agent, root, read a file of its choosing, nor build, from sources of its own, an environment
that another job asking for the same packages then runs.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass

from tfcluster.daemon.agent.code.request_files import RequestFileProblem, read_as, read_files
from tfcluster.daemon.agent.code.request_rules import PYPI, lock_problem, project_problem, requirements_problem
from tfcluster.daemon.agent.tasks.users import TaskUser
from tfcluster.model import EnvironmentSpec


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
    parts = [b"tfcluster-environment-1", (python or platform_tag()).encode(),
             b"isolated" if request.isolated else b"shared"]
    for name, content in request.files:
        parts += [name.encode(), content]
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def read_request(spec: EnvironmentSpec, workdir: str, user: TaskUser, indexes: tuple[str, ...] = (PYPI,)) -> Request:
    """The files the spec names, read from the workdir as the task's user (code/request_files.py) and checked against
    what a job may ask for (code/request_rules.py); indexes: the operator's, the only ones a uv.lock may name."""
    if spec.requirements:
        content, = _read(workdir, [(spec.requirements, False)], user)
        _refuse(requirements_problem(spec.requirements, content))
        return Request((("requirements.txt", content),), spec.isolated)
    directory = spec.project.rstrip("/") if spec.project not in ("", ".") else ""
    names = [f"{directory}/{name}" if directory else name for name in ("pyproject.toml", "uv.lock")]
    project, lock = _read(workdir, [(names[0], False), (names[1], True)], user)
    _refuse(project_problem(names[0], project) or (lock_problem(names[1], lock, indexes) if lock is not None else ""))
    return Request((("pyproject.toml", project), *((("uv.lock", lock),) if lock is not None else ())), spec.isolated)


def _read(workdir: str, files: list[tuple[str, bool]], user: TaskUser) -> list[bytes | None]:
    """As the task's user, in a child process, where the agent is root and the task is not; else here."""
    workdir = os.path.abspath(workdir or ".")  # the reader starts in /: a relative workdir is the agent's
    try:
        if user.switches and user.uid != os.geteuid():
            return read_as(workdir, files, user.uid, user.gid, user.groups)
        return read_files(workdir, files)
    except RequestFileProblem as e:
        who = f"the job's user (uid {user.uid})" if user.switches else "the agent's user"
        raise EnvironmentProblem(f"cannot read the environment's files in the workdir {workdir} as {who}: {e}") \
            from None


def _refuse(problem: str) -> None:
    if problem:
        raise EnvironmentProblem(f"the job's environment asks for what a job may not: {problem}")
