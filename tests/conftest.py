"""Shared fixtures: local clusters of real coordinator and agent processes (see harness.py)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest
from _pytest.tmpdir import TempPathFactory

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tfcluster import grpc_settings  # noqa: E402

grpc_settings.apply()  # the tests fork while they call, as the daemons do; the daemons they start apply their own

from etcdcluster import etcd_cluster, etcd_prefix  # noqa: E402,F401  (a real etcd cluster, for the etcd store)
from hacluster import ha  # noqa: E402,F401  (several coordinators on that etcd)

# Tasks run as their job's own user (with --private-tmp, the job's own dir mounted on /tmp). What the tests give
# them (programs, specs, checkpoint dirs) lives in a scratch dir outside /tmp, as a shared scratch dir would:
# traversable (its base, 0711), and each test's temp dir open to every user the way /tmp is (1777).
SCRATCH_PARENT = "/var/tmp"
SCRATCH_BASE_MODE = 0o711
SCRATCH_DIR_MODE = 0o1777
_made_scratch: list[str] = []


def pytest_configure(config):
    _check_tasks_can_run_python()
    if config.option.basetemp is None and os.path.isdir(SCRATCH_PARENT):
        config.option.basetemp = tempfile.mkdtemp(prefix="tfcluster-tests-", dir=SCRATCH_PARENT)
        _made_scratch.append(config.option.basetemp)
    plain_getbasetemp, plain_mktemp = TempPathFactory.getbasetemp, TempPathFactory.mktemp

    # pytest makes the base (again) 0700 when first asked for it: in the parallel run, both the run's base and
    # each worker's base below it.
    def shared_getbasetemp(self) -> Path:
        path = plain_getbasetemp(self)
        path.chmod(SCRATCH_BASE_MODE)
        return path

    def shared_mktemp(self, basename: str, numbered: bool = True) -> Path:
        path = plain_mktemp(self, basename, numbered)
        path.chmod(SCRATCH_DIR_MODE)
        return path
    TempPathFactory.getbasetemp, TempPathFactory.mktemp = shared_getbasetemp, shared_mktemp


def _check_tasks_can_run_python() -> None:
    """As root, tasks run as other users: they must be able to run this interpreter and read this checkout (the
    package they import), as they would a system Python and a shared checkout."""
    if os.geteuid() != 0:
        return
    from tfcluster import reach
    from tfcluster.daemon.agent.shim.isolation import acting_as
    python, checkout = os.path.realpath(sys.executable), str(Path(__file__).resolve().parent.parent)
    with acting_as(65534, 65534):
        closed = [(path, reach.first_blocked(path)) for path, mode in ((python, os.X_OK), (checkout, os.R_OK | os.X_OK))
                  if not os.access(path, mode, effective_ids=True)]
    if closed:
        path, blocked = closed[0]
        raise pytest.UsageError(f"tasks run as their job's own user and cannot reach {path}: "
                                + (f"{reach.describe(blocked)} lets no other user through; make it traversable "
                                   f"(chmod o+x {blocked})" if blocked else f"other users may not use it"))


def pytest_unconfigure(config):
    for path in _made_scratch:
        shutil.rmtree(path, ignore_errors=True)

import harness  # noqa: E402
from harness import LocalCluster, running_cluster  # noqa: E402

_DAEMONS_BEFORE = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_DAEMONS_BEFORE] = len(harness.STARTED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that failed shows the end of the log of every daemon it started (and of those still running): a
    timing failure in CI is otherwise known by its assertion alone."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when in ("call", "setup"):
        for name, tail in harness.log_tails(item.stash.get(_DAEMONS_BEFORE, len(harness.STARTED))):
            report.sections.append((f"end of the log of {name}", tail))


@pytest.fixture
def make_cluster(tmp_path_factory):
    """A fresh cluster per test (for tests that kill daemons)."""
    made: list[LocalCluster] = []

    def make(lost_after: float = 3.0, *coordinator_args: str, tls: bool = True) -> LocalCluster:
        cluster = LocalCluster(root=tmp_path_factory.mktemp("cluster"), lost_after=lost_after, tls=tls)
        made.append(cluster)
        cluster.start_coordinator(*coordinator_args)
        return cluster
    yield make
    for cluster in made:
        cluster.teardown()


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """One coordinator and three agents (a: 2 GPUs, b: 2 GPUs, c: CPU only) shared by a module's tests."""
    with running_cluster(tmp_path_factory.mktemp("shared"), {"a": {"gpus": 2}, "b": {"gpus": 2}, "c": {}}) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def signal_handlers_unchanged():
    """A test that runs daemon code in the test's own process must leave its signal handlers as they were: a
    SIGINT left ignored is inherited by every process later tests start, and Ctrl-C no longer reaches them."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    changed = [signal.Signals(sig).name for sig, handler in before.items() if signal.getsignal(sig) != handler]
    assert changed == [], f"the test left the handlers of {', '.join(changed)} changed"
