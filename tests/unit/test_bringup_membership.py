"""How `up` changes the coordinators of a cluster on etcd (membership.py): from what a live member lists and what
each host holds, the members to add (one at a time, each started with the members it joins) and those to remove;
members that stay keep the file they were made with, so nothing restarts them for nothing."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from tfcluster.bringup import membership
from tfcluster.bringup.desired import CA_DIR, desired
from tfcluster.bringup.etcd import DATA_DIR, ETCD_ENV_FILE, ETCD_UNIT, initial_cluster, peer_url
from tfcluster.bringup.inventory import parse
from tfcluster.bringup.plan import plan_up

CA = {name: name.encode() for name in ("ca.crt", "ca.key", "coordinator.crt", "coordinator.key")}
ETCD_TLS = {"ca.crt": b"etcd ca", "member.crt": b"cert", "member.key": b"key"}


def inventory(*names: str):
    parsed = parse({"software": {"extras": []}, "coordinators": [{"host": n} for n in names],
                    "nodes": [{"host": "n1", "advertise_address": "10.0.0.11"}]})
    return replace(parsed, hosts=tuple(replace(h, advertise_address=h.advertise_address or f"10.0.0.{h.host[1]}")
                                       for h in parsed.hosts))


MADE = inventory("c1", "c2", "c3")


def host(inv, name):
    return next(h for h in inv.hosts if h.host == name)


def listed(*names: str, unstarted: tuple[str, ...] = ()) -> dict:
    """A member's answer to member/list: the members named (started) and those added but not started."""
    return {"members": [{"ID": str(1000 + int(n[1])), "name": "" if n in unstarted else n,
                         "peerURLs": [f"https://10.0.0.{n[1]}:2380"]} for n in names + unstarted]}


def facts(members: dict | None, with_data=("c1", "c2", "c3"), others=()) -> dict[str, dict]:
    """Probe facts: hosts with_data hold a member made from MADE and answer with `members`; others hold none."""
    found = {}
    for name in with_data:
        found[name] = {"dirs": {DATA_DIR: True}, "exists": {}, "etcd_members": members,
                       "env": {ETCD_ENV_FILE: {"ETCD_INITIAL_CLUSTER": initial_cluster(MADE),
                                               "ETCD_INITIAL_CLUSTER_STATE": "new"}}}
    for name in others:
        found[name] = {"dirs": {}, "exists": {}, "etcd_members": None, "env": {ETCD_ENV_FILE: {}}}
    return found


def test_the_same_three_members_change_nothing():
    seen = facts(listed("c1", "c2", "c3"))
    assert membership.problems(MADE, seen) == []
    assert membership.change(MADE, seen) is None


def test_a_replaced_host_joins_with_the_members_it_finds_and_the_departed_one_is_removed_after():
    moved = inventory("c1", "c2", "c4")
    seen = facts(listed("c1", "c2", "c3"), with_data=("c1", "c2"), others=("c4",))
    assert membership.problems(moved, seen) == []
    change = membership.change(moved, seen)
    assert change.through.host == "c1"
    assert [h.host for h in change.joining] == ["c4"] and not change.added(host(moved, "c4"))
    assert [(m.name, m.id) for m in change.leaving] == [("c3", "1003")]
    initial = membership.initial(moved, seen, change)
    assert initial["c4"] == ("c1=https://10.0.0.1:2380,c2=https://10.0.0.2:2380,c3=https://10.0.0.3:2380,"
                             "c4=https://10.0.0.4:2380", "existing")
    assert initial["c1"] == (initial_cluster(MADE), "new"), "a member that stays keeps what it was made with"
    step = membership.add_step(change, host(moved, "c4"))
    assert step.action["path"] == "/v3/cluster/member/add"
    assert step.action["body"] == {"peerURLs": [peer_url(host(moved, "c4"))]}
    assert step.action["client_url"] == "https://10.0.0.1:2379", "made through a member that stays"
    assert membership.remove_step(change, change.leaving[0]).action["body"] == {"ID": "1003"}


def test_a_member_that_stays_is_not_restarted_while_its_coordinator_gets_the_new_endpoints():
    moved = inventory("c1", "c2", "c4")
    seen = facts(listed("c1", "c2", "c3"), with_data=("c1", "c2"), others=("c4",))
    initial = membership.initial(moved, seen, membership.change(moved, seen))
    c1 = host(moved, "c1")
    made = desired(MADE, host(MADE, "c1"), CA, ETCD_TLS)
    have = {"software": "1", "joined": True, "running": {s: True for s in made.services},
            "files": {p: hashlib.sha256(f.data).hexdigest() for p, f in made.files.items()}}
    steps = [s.name for s in plan_up(c1, desired(moved, c1, CA, ETCD_TLS, initial["c1"]), have, moved.software,
                                     "1").steps]
    assert not any(ETCD_UNIT in s for s in steps), steps
    assert any(s.startswith("start tfcluster-coordinator.service") for s in steps), steps


def test_two_joining_hosts_join_one_after_the_other():
    moved = inventory("c1", "c4", "c5")
    seen = facts(listed("c1", "c2", "c3"), with_data=("c1",), others=("c4", "c5"))
    change = membership.change(moved, seen)
    assert [h.host for h in change.joining] == ["c4", "c5"]
    assert [m.name for m in change.leaving] == ["c2", "c3"]
    assert membership.initial(moved, seen, change)["c5"][0].endswith("c4=https://10.0.0.4:2380,"
                                                                     "c5=https://10.0.0.5:2380")


def test_a_member_added_by_an_earlier_run_that_stopped_is_started_not_added_again():
    moved = inventory("c1", "c2", "c4")
    seen = facts(listed("c1", "c2", "c3", unstarted=("c4",)), with_data=("c1", "c2"), others=("c4",))
    change = membership.change(moved, seen)
    assert change.added(host(moved, "c4"))
    assert membership.initial(moved, seen, change)["c4"][0].count("c4=") == 1


def test_a_new_coordinator_is_refused_when_no_member_answers_with_its_list():
    moved = inventory("c1", "c2", "c4")
    seen = facts({"error": "connection refused"}, with_data=("c1", "c2"), others=("c4",))
    assert membership.problems(moved, seen) == [
        "c4: to add its member, `up` needs etcd's member list, and no member answered: c1: connection refused; "
        "c2: connection refused"]


def test_a_departing_host_loses_etcd_and_the_cas_key_and_its_software_only_when_it_leaves_the_inventory():
    moved = inventory("c1", "c2", "c4")
    gone = membership.leaving_host(moved, membership.Member("1003", "c3", "https://10.0.0.3:2380"))
    assert (gone.host, gone.ssh_port) == ("c3", 22)
    steps = membership.retire_steps(moved, gone)
    removed = steps[-1].action["paths"]
    assert CA_DIR in removed and DATA_DIR in removed and moved.software.prefix in removed
    assert [s.action.get("service") for s in steps[:-1]] == [ETCD_UNIT, "tfcluster-agent.service"]
    as_node = parse({"software": {"extras": []}, "coordinators": [{"host": n} for n in ("c1", "c2", "c4")],
                     "nodes": [{"host": "c3"}]})
    stays = membership.leaving_host(as_node, membership.Member("1003", "c3", "https://10.0.0.3:2380"))
    steps = membership.retire_steps(as_node, stays)
    assert [s.action.get("service") for s in steps[:-1]] == [ETCD_UNIT], "its agent runs on"
    assert as_node.software.prefix not in steps[-1].action["paths"]


def test_replacing_all_three_is_refused_once_nodes_have_joined():
    moved = inventory("c4", "c5", "c6")
    seen = facts(None, with_data=(), others=("c4", "c5", "c6"))
    assert membership.problems(moved, seen) == [], "a new cluster"
    seen["n1"] = {"joined": True}
    assert membership.problems(moved, seen) == [
        "n1: joined a cluster none of whose coordinators the inventory names (no coordinator host holds an etcd "
        "member or the cluster's SQLite store): replace at most two coordinators at a time, or `tfcluster down "
        "--purge` these nodes to make a new cluster"]


class Unreachable(Exception):
    pass


def carried_out(dead: set[str], lost: set[str] = frozenset()) -> tuple[list[str], list[str]]:
    """The order in which reconfigure.change_members touches hosts, replacing c3 by c4: hosts in dead did not
    answer over SSH before the plans were made, those in lost stop answering during the change; and its warnings."""
    from tfcluster.bringup import reconfigure

    moved = inventory("c1", "c2", "c4")
    change = membership.change(moved, facts(listed("c1", "c2", "c3"), with_data=("c1", "c2"), others=("c4",)))
    change = replace(change, dead=frozenset(m.id for m in change.leaving if m.name in dead))
    done: list[str] = []

    def apply_steps(host, steps):
        if host.host in dead | lost:
            raise Unreachable(f"{host.host}: ssh: connect to host {host.host} port 22: Connection refused")
        done.extend(f"{host.host}: {s.name}" for s in steps)

    warnings = reconfigure.change_members(moved, change, apply_steps, lambda h: done.append(f"{h.host}: bring up"),
                                          (Unreachable,), lambda line: None)
    return [line.split(" (")[0] for line in done], warnings


def test_a_departing_host_stops_its_coordinator_and_leaves_etcd_only_after_the_new_member_joined():
    done, warnings = carried_out(dead=set())
    assert done[:4] == ["c3: stop tfcluster-coordinator.service", "c1: add c4's etcd member", "c4: bring up",
                        "c1: remove c3's etcd member through c1"]
    assert done[4] == "c3: stop tfcluster-etcd.service" and done[-1].startswith("c3: remove /etc/tfcluster/etcd.env")
    assert warnings == []


def test_a_dead_departing_host_loses_its_member_before_any_host_joins_and_up_says_what_is_left_there():
    done, warnings = carried_out(dead={"c3"})
    assert done == ["c1: remove c3's etcd member through c1", "c1: add c4's etcd member", "c4: bring up"]
    assert len(warnings) == 1 and warnings[0].startswith("c3: its etcd member was removed, but the host could not be "
                                                         "cleared (it did not answer over SSH)")
    moved = inventory("c1", "c2", "c4")
    seen = facts(listed("c1", "c2", "c3"), with_data=("c1", "c2"), others=("c4",))
    change = replace(membership.change(moved, seen), dead=frozenset({"1003"}))
    assert membership.initial(moved, seen, change)["c4"][0] == (
        "c1=https://10.0.0.1:2380,c2=https://10.0.0.2:2380,c4=https://10.0.0.4:2380"), "c3 is gone when c4 starts"


def test_a_host_lost_during_the_change_leaves_etcd_after_the_new_member_joined():
    done, warnings = carried_out(dead=set(), lost={"c3"})
    assert done == ["c1: add c4's etcd member", "c4: bring up", "c1: remove c3's etcd member through c1"]
    assert len(warnings) == 1 and "Connection refused" in warnings[0]


def test_one_coordinator_becoming_three_moves_its_sqlite_store_into_etcd_once():
    from tfcluster.bringup.membership import COORDINATOR_STORE, MOVED_MARK
    single = {"c1": {"dirs": {}, "exists": {COORDINATOR_STORE: True}, "env": {}}, "n1": {"joined": True}}
    assert membership.problems(MADE, single) == []
    assert membership.moving_store(MADE, single).host == "c1"
    assert membership.change(MADE, single) is None, "the three members are made new"
    steps = membership.move_steps(MADE, host(MADE, "c1"))
    assert [s.action["kind"] for s in steps] == ["stop", "run", "write"]
    argv = steps[1].action["argv"]
    assert argv[:3] == ["/opt/tfcluster/bin/tfcluster", "coordinator", "migrate-store"] and "--force" not in argv
    assert argv[argv.index("--from") + 1] == f"sqlite://{COORDINATOR_STORE}"
    assert argv[argv.index("--to") + 1] == "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/tfcluster"
    assert steps[2].action["path"] == MOVED_MARK
    moved = {"c1": {"dirs": {}, "exists": {COORDINATOR_STORE: True, MOVED_MARK: True}, "env": {}}}
    assert membership.moving_store(MADE, moved) is None, "moved once: the SQLite file is a backup"
    assert membership.moving_store(inventory("c1"), single) is None, "one coordinator stays on SQLite"
    two = {**single, "c2": single["c1"]}
    assert membership.problems(MADE, two) == [
        f"c1, c2: each holds a coordinator's SQLite store ({COORDINATOR_STORE}), and only one can move to etcd: "
        "`tfcluster down --purge` the others first"]


def test_a_host_back_with_the_data_of_a_removed_member_is_refused_until_cleared():
    moved = inventory("c1", "c2", "c3")
    seen = facts(listed("c1", "c2", "c4"))  # c3 was replaced by c4 while it was away, and now is listed again
    assert membership.problems(moved, seen) == [
        f"c3: holds etcd data ({DATA_DIR}) but is not among etcd's members: a member removed while its host was "
        "away; clear it first (`tfcluster down --purge` with an inventory naming only that host), then run `up` "
        "again"]
