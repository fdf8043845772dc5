"""Several coordinators on one etcd prefix, with agents and the CLI given every one of them: the cluster the
failover tests run (tests/integration/test_failover.py, tests/e2e/test_failover_training.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import Daemon, LocalCluster, free_port, wait_until

PY = sys.executable


class HaCluster(LocalCluster):
    """Coordinators on one etcd prefix; agents and the CLI are given every one of them."""

    etcd = None  # the EtcdCluster they share, when the test has one

    def start_coordinators(self, store_url: str | list[str], count: int, *extra: str,
                           first_leads: bool = False) -> list[Daemon]:
        """count coordinators on store_url (or on one URL each, as a list), reaching etcd over plain HTTP (the
        tests' etcd serves loopback alone); extra: flags every one is given. first_leads: the others start once
        the first leads."""
        from tfcluster import pki
        pki.init_ca(self.ca_dir, ["127.0.0.1"])
        stores = store_url if isinstance(store_url, list) else [store_url] * count
        listens = [f"127.0.0.1:{free_port()}" for _ in range(count)]
        joins = [f"127.0.0.1:{free_port()}" for _ in range(count)]
        self.address, self.join_address, self.listens = ",".join(listens), ",".join(joins), listens
        self.coordinators = []
        for i, (listen, join, store) in enumerate(zip(listens, joins, stores)):
            self.coordinators.append(Daemon(f"coordinator{i}", [
                "coordinator", "--listen", listen, "--join-listen", join, "--state-dir", str(self.root / f"c{i}"),
                "--lost-after", str(self.lost_after), "--tasks-lost-after", str(self.tasks_lost_after),
                "--tls-dir", str(self.ca_dir), "--store", store,
                "--etcd-insecure", *extra],
                self.root / f"coordinator{i}.log").start())
            if first_leads and i == 0:
                wait_until(lambda: self.leader() == listens[0], 30, what="the first coordinator to lead")
        wait_until(lambda: self.leader(), 30, what="a coordinator to lead")
        self.join_token = self.cli("token", "create", "--reusable", "--ttl", "1d", check=True).stdout.strip()
        return self.coordinators

    def new_leader(self, old: str, timeout: float, etcd_term: int | None = None) -> str:
        """The address of a leader other than old, once one serves (within timeout; given etcd's election term
        from before the old leader went, longer only if etcd held an election meanwhile: within_takeover)."""
        def serving() -> str:
            address = self.leader()
            return address if address and address != old else ""
        return within_takeover(serving, "a standby to serve", timeout, lambda: etcd_term is not None and
                               self.etcd is not None and self.etcd.raft_term() != etcd_term)

    def leader(self) -> str:
        """The leader's address, as the coordinators answer; "" while none answers."""
        try:
            return self.status()["summary"]["leader"]
        except Exception:
            return ""

    def leading(self) -> Daemon:
        return self.coordinators[self.listens.index(self.leader())]

    def teardown(self) -> None:
        for daemon in self.coordinators:
            if daemon.alive:
                daemon.kill()
        super().teardown()


@pytest.fixture
def ha(tmp_path, etcd_cluster, etcd_prefix):
    cluster = HaCluster(root=tmp_path)
    cluster.coordinators, cluster.etcd = [], etcd_cluster
    try:
        cluster.start_coordinators(etcd_cluster.url(etcd_prefix), 3)
        yield cluster
    finally:
        cluster.teardown()


def within_takeover(predicate, what: str, seconds: float, elected: Callable[[], bool]):
    """predicate() once it holds, within seconds of a leader going; up to 15 s more only when elected() says etcd
    held an election of its own meanwhile (its members short of CPU on a loaded machine), as each new etcd leader
    grants every lease its TTL again plus an election timeout."""
    try:
        return wait_until(predicate, seconds, interval=0.05, what=what)
    except AssertionError:
        if not elected():
            raise
    return wait_until(predicate, 15, interval=0.05, what=f"{what}, after an election in etcd")


def sleeper(cluster: HaCluster, launches: Path, name: str, seconds: int, workers: int = 2) -> str:
    """A job whose every task launch adds a line to the file launches, then runs for seconds."""
    command = f"import time; open({str(launches)!r}, 'a').write('launched\\n'); time.sleep({seconds})"
    return cluster.cli("start", "--name", name, "--strategy", "multi_worker_mirrored", "--workers", str(workers),
                       "--", PY, "-c", command, check=True).stdout.strip()


def running(cluster: HaCluster, job_id: str) -> bool:
    return cluster.job(job_id)["state"] == "RUNNING"


def registrations(cluster: HaCluster, name: str, address: str) -> int:
    return cluster.agents[name].log().count(f"registered with {address} ")
