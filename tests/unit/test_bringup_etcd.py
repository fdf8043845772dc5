"""What `tfcluster up` puts on three coordinator hosts for etcd: a member on each, with TLS for clients and peers,
the initial cluster from the inventory, and coordinators on that store; a second `up` and a software change leave
a running member alone."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from tfcluster.bringup.desired import COORDINATOR_UNIT, ENV_FILE, UNIT_DIR, desired, owned_paths, services
from tfcluster.bringup.etcd import ETCD_ENV_FILE, ETCD_UNIT, TLS_DIR
from tfcluster.bringup.inventory import parse
from tfcluster.bringup.plan import plan_down, plan_up, probed_dirs

PARSED = parse({"software": {"extras": []}, "coordinators": [{"host": f"c{i}"} for i in (1, 2, 3)],
                "nodes": [{"host": "n1", "advertise_address": "10.0.0.11"}]})
INVENTORY = replace(PARSED, hosts=tuple(replace(h, advertise_address=h.advertise_address or f"10.0.0.{i + 1}")
                                        for i, h in enumerate(PARSED.hosts)))
C1, C2, C3, N1 = INVENTORY.hosts
CA = {name: name.encode() for name in ("ca.crt", "ca.key", "coordinator.crt", "coordinator.key")}
ETCD_TLS = {"ca.crt": b"etcd ca", "member.crt": b"cert", "member.key": b"key"}
SOFTWARE = "0.8.0+abc"


def env(path: str, host) -> dict[str, str]:
    text = desired(INVENTORY, host, CA, ETCD_TLS).files[path].data.decode()
    return dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))


def settled(host) -> dict:
    wanted = desired(INVENTORY, host, CA, ETCD_TLS)
    return {"software": SOFTWARE, "files": {p: hashlib.sha256(f.data).hexdigest() for p, f in wanted.files.items()},
            "running": {s: True for s in wanted.services}, "joined": True,
            "dirs": {d: True for d in probed_dirs(INVENTORY.software)}}


def test_each_coordinator_host_runs_a_member_of_one_cluster_over_tls():
    assert env(ENV_FILE, C2)["TFCLUSTER_LISTEN"] == "10.0.0.2:7070", "on its own address, as its member"
    member = env(ETCD_ENV_FILE, C2)
    assert member["ETCD_NAME"] == "c2" and member["ETCD_LISTEN_CLIENT_URLS"] == "https://10.0.0.2:2379"
    assert member["ETCD_INITIAL_CLUSTER"] == ("c1=https://10.0.0.1:2380,c2=https://10.0.0.2:2380,"
                                              "c3=https://10.0.0.3:2380")
    assert member["ETCD_CLIENT_CERT_AUTH"] == member["ETCD_PEER_CLIENT_CERT_AUTH"] == "true"
    assert member["ETCD_PEER_TRUSTED_CA_FILE"] == f"{TLS_DIR}/ca.crt"
    assert env(ETCD_ENV_FILE, C1)["ETCD_INITIAL_CLUSTER_TOKEN"] == member["ETCD_INITIAL_CLUSTER_TOKEN"]
    wanted = desired(INVENTORY, C2, CA, ETCD_TLS)
    assert wanted.files[f"{TLS_DIR}/member.key"].mode == 0o600 and wanted.files[ETCD_ENV_FILE].mode == 0o600
    assert list(wanted.services) == [ETCD_UNIT, COORDINATOR_UNIT] == services(INVENTORY, C2)
    assert set(wanted.files) <= set(owned_paths(INVENTORY, C2))


def test_coordinators_use_the_three_members_and_advertise_their_host():
    args = env(ENV_FILE, C3)["TFCLUSTER_COORDINATOR_ARGS"].split()
    assert args[args.index("--store") + 1] == "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/tfcluster"
    assert args[args.index("--advertise-address") + 1] == "c3"
    assert args[args.index("--etcd-key") + 1] == f"{TLS_DIR}/member.key"
    assert env(ENV_FILE, N1)["TFCLUSTER_COORDINATOR"] == "c1:7070,c2:7070,c3:7070"
    assert not any("etcd" in path for path in desired(INVENTORY, N1, CA).files)


def test_a_bare_coordinator_host_starts_etcd_and_waits_for_its_quorum_before_the_coordinator():
    p = plan_up(C1, desired(INVENTORY, C1, CA, ETCD_TLS), {"files": {}, "running": {}}, INVENTORY.software,
                SOFTWARE)
    kinds = [(s.action["kind"], s.action.get("service")) for s in p.steps if s.action["kind"] != "write"]
    assert kinds == [("install", None), ("start", ETCD_UNIT), ("wait_etcd", None), ("start", COORDINATOR_UNIT)]
    start = next(s for s in p.steps if s.action.get("service") == ETCD_UNIT)
    assert start.action["env_file"] == ETCD_ENV_FILE


def test_a_second_up_or_a_new_release_leaves_a_running_member_alone():
    assert plan_up(C1, desired(INVENTORY, C1, CA, ETCD_TLS), settled(C1), INVENTORY.software, SOFTWARE).changes == []
    upgrade = plan_up(C1, desired(INVENTORY, C1, CA, ETCD_TLS), settled(C1), INVENTORY.software, "0.9.0+def")
    assert [s.action.get("service") for s in upgrade.steps if s.action["kind"] == "start"] == [COORDINATOR_UNIT]


def test_down_stops_the_coordinator_before_its_member():
    p = plan_down(C1, services(INVENTORY, C1), settled(C1), INVENTORY.software, purge=False)
    assert p.changes[:2] == [f"stop {COORDINATOR_UNIT}", f"stop {ETCD_UNIT}"]
    assert f"{UNIT_DIR}/{ETCD_UNIT}" in p.steps[-1].action["paths"]


# ---- the coordinators a cluster was made with -----------------------------------------------------------------

def made_with(inventory, host_names=("c1", "c2", "c3"), sqlite=False) -> dict[str, dict]:
    """The probe's facts of a cluster whose etcd members were made from `inventory` on those hosts."""
    from tfcluster.bringup.etcd import DATA_DIR, initial_cluster
    from tfcluster.bringup.membership import COORDINATOR_STORE
    facts = {}
    for name in host_names:
        facts[name] = {"dirs": {DATA_DIR: True}, "exists": {COORDINATOR_STORE: sqlite},
                       "env": {ETCD_ENV_FILE: {"ETCD_INITIAL_CLUSTER": initial_cluster(inventory)}}}
    return facts


def test_up_refuses_to_take_a_cluster_off_etcd_before_writing_anything():
    from tfcluster.bringup.membership import problems
    assert problems(INVENTORY, made_with(INVENTORY)) == [], "the same three: nothing to say"
    assert problems(INVENTORY, {}) == [], "a new cluster: nothing made yet"
    one = parse({"software": {"extras": []}, "coordinators": [{"host": "c1"}]})
    assert problems(one, made_with(INVENTORY, ("c1",))) == [
        "c1: holds an etcd member of the cluster; the inventory names one coordinator, without etcd, and `up` does "
        "not move the cluster's records off etcd"]


def test_the_probe_reads_the_env_files_up_wrote(tmp_path):
    from tfcluster.bringup import remote
    written = tmp_path / "etcd.env"
    written.write_text("# Written by `tfcluster up`\nETCD_NAME=c1\nETCD_INITIAL_CLUSTER=c1=https://a:2380,c2=https://b:2380\n")
    assert remote.env_values(str(written)) == {"ETCD_NAME": "c1",
                                               "ETCD_INITIAL_CLUSTER": "c1=https://a:2380,c2=https://b:2380"}
    assert remote.env_values(str(tmp_path / "missing.env")) == {}


class Etcd:
    """etcd's answers to a membership change, one per try: None succeeds, an exception is raised."""

    def __init__(self, *answers):
        self.answers, self.tries = list(answers), 0

    def __call__(self, step, path, body, timeout):
        self.tries += 1
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer


def change(monkeypatch, path, *answers):
    """etcd_member against those answers, on a clock that moves a second per wait; (tries, error or None)."""
    from tfcluster.bringup import remote

    etcd, now = Etcd(*answers), [0.0]
    monkeypatch.setattr(remote, "etcd_call", etcd)
    try:
        remote.etcd_member({"path": path, "body": {}}, clock=lambda: now[0],
                           sleep=lambda seconds: now.__setitem__(0, now[0] + seconds))
    except Exception as e:  # noqa: BLE001  the error the step fails with
        return etcd.tries, e
    return etcd.tries, None


def test_a_membership_change_waits_out_the_election_that_follows_the_leaders_death(monkeypatch):
    from tfcluster.bringup.remote import StepFailed

    remove = "/v3/cluster/member/remove"
    # The member asked timed out while the others elected a leader, then etcd said so, then it went through.
    assert change(monkeypatch, remove, TimeoutError("The read operation timed out"),
                  StepFailed("etcd at https://c4:2379: etcdserver: leader changed"), None) == (3, None)
    # The try that timed out had removed it: the next one finds it gone, which is what was asked.
    assert change(monkeypatch, remove, TimeoutError("timed out"),
                  StepFailed("etcd at https://c4:2379: etcdserver: member not found")) == (2, None)
    add = "/v3/cluster/member/add"
    assert change(monkeypatch, add, TimeoutError("timed out"),
                  StepFailed("etcd at https://c4:2379: etcdserver: Peer URLs already exists")) == (2, None)


def test_a_membership_change_etcd_refuses_fails_at_once_and_one_it_never_answers_within_a_minute(monkeypatch):
    from tfcluster.bringup.remote import MEMBER_CHANGE_SECONDS, StepFailed

    refused = StepFailed("etcd at https://c4:2379: etcdserver: unhealthy cluster")
    tries, error = change(monkeypatch, "/v3/cluster/member/add", refused)
    assert (tries, error) == (1, refused)
    # "member not found" on the first try is no earlier try's doing: the step fails with it.
    gone = StepFailed("etcd at https://c4:2379: etcdserver: member not found")
    assert change(monkeypatch, "/v3/cluster/member/remove", gone) == (1, gone)
    silent = [TimeoutError("timed out")] * (MEMBER_CHANGE_SECONDS + 5)
    tries, error = change(monkeypatch, "/v3/cluster/member/remove", *silent)
    assert isinstance(error, TimeoutError) and tries == MEMBER_CHANGE_SECONDS + 1
