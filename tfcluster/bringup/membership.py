"""Whether the inventory's coordinators are the cluster's etcd members, and how `up` makes them so: the desired
membership (the inventory's three coordinator hosts) against the actual one (what a live member lists).

etcd's members change one at a time at runtime, through a live member, and a new member starts with the members
it joins (ETCD_INITIAL_CLUSTER, ETCD_INITIAL_CLUSTER_STATE=existing): ETCD_INITIAL_CLUSTER counts only at a
member's first start. So `up` replaces a coordinator host by adding the new host's member first and starting it
(the cluster keeps its quorum while it grows), then stopping the departing host's coordinator, removing its member
and taking etcd and the CA's key off that host. Members that stay keep the environment file they were made with:
rewriting it would restart them for nothing.

One coordinator becoming three moves the cluster's records: the three members are made and started, the single
coordinator is stopped, `tfcluster coordinator migrate-store` copies its SQLite store into etcd (and checks the
copy), and only then do the three coordinators start on etcd. A mark beside the store says it moved: the SQLite
file stays as a backup, and is never copied again.

What `up` still refuses, before anything is written: going from three coordinators back to one, and replacing
all three at once (no member would be left to add the new ones through, nor to hold the records).
docs/operators.md#changing-the-coordinators says how.

Pure: the probe's facts come in (remote.probe: `dirs`, `exists`, `env`, `etcd_members`), the problems, the
change and the steps go out; reconfigure.py carries the steps out.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcluster import layout
from tfcluster.bringup import etcd
from tfcluster.bringup.desired import AGENT_UNIT, CA_DIR, COORDINATOR_UNIT, ENV_FILE
from tfcluster.bringup.hostfiles import STATE_DIR, UNIT_DIR
from tfcluster.bringup.inventory import Host, Inventory
from tfcluster.bringup.plan import Step, stop_step, write_action

COORDINATOR_STATE = f"{STATE_DIR}/coordinator"
COORDINATOR_STORE = f"{COORDINATOR_STATE}/{layout.COORDINATOR_DB}"  # the coordinator unit's --state-dir
MOVED_MARK = f"{COORDINATOR_STATE}/moved-to-etcd"   # written once the store above was copied into etcd
REMEDY = ("nothing was changed; remedy: see docs/operators.md#changing-the-coordinators for the changes `up` "
          "makes, and how to make the others")


@dataclass(frozen=True)
class Member:
    """One of etcd's members as a member lists it; a member added but not started yet has no name."""
    id: str
    name: str
    peer_url: str


@dataclass(frozen=True)
class Change:
    through: Host                      # a coordinator host that stays, whose member answered: changes go through it
    members: tuple[Member, ...]        # as it listed them before this run
    joining: tuple[Host, ...]          # the inventory's coordinators whose member has not started, in order
    leaving: tuple[Member, ...]        # members the inventory no longer names
    dead: frozenset[str] = frozenset()  # ids of those whose host does not answer over SSH: removed first

    def added(self, host: Host) -> bool:
        """Whether host's member is already among etcd's (added by an earlier run that stopped before it started)."""
        return any(m.peer_url == etcd.peer_url(host) for m in self.members)

    def initial_cluster(self, host: Host) -> str:
        """The joining host's ETCD_INITIAL_CLUSTER: every member once it is added (the hosts before it have been;
        the dead ones were removed before any joined, the others leave after all have), each by its name."""
        names = {etcd.peer_url(h): etcd.member_name(h) for h in self.joining}
        urls = [m.peer_url for m in self.members if m.id not in self.dead]
        urls += [etcd.peer_url(h) for h in self.joining[:self.joining.index(host) + 1] if etcd.peer_url(h) not in urls]
        listed = {m.peer_url: m.name for m in self.members}
        return ",".join(f"{names.get(url) or listed[url]}={url}" for url in urls)

    def describe(self) -> list[str]:
        return ([f"etcd's members now: {', '.join(m.name or m.peer_url for m in self.members)}"] +
                [f"remove {m.name}'s member first: its host does not answer over SSH" for m in self.leaving
                 if m.id in self.dead] +
                [f"add {h.host}'s member ({etcd.peer_url(h)}) through {self.through.host}, then start it"
                 for h in self.joining] +
                [f"stop the coordinator on {m.name}, remove its member, take etcd and the CA's key off it"
                 for m in self.leaving if m.id not in self.dead])


def probe_request(inventory: Inventory, host: Host) -> dict:
    """What the probe must report for problems() and change() (merged into each host's probe request)."""
    request: dict = {"exists": [COORDINATOR_STORE, MOVED_MARK], "env_files": [etcd.ETCD_ENV_FILE]}
    if host.coordinator and inventory.on_etcd:
        request["etcd_members"] = etcd.members_probe(host)
    return request


def _listed(inventory: Inventory, facts: dict[str, dict]) -> tuple[Host | None, list[Member], list[str]]:
    """The first coordinator host whose member answered with its list, that list, and what the others said."""
    errors = []
    for host in inventory.coordinators:
        said = facts.get(host.host, {}).get("etcd_members")
        if said and "members" in said:
            return host, [Member(str(m.get("ID", "")), m.get("name", ""), (m.get("peerURLs") or [""])[0])
                          for m in said["members"]], errors
        if said:
            errors.append(f"{host.host}: {said['error']}")
    return None, [], errors


def _has_data(facts: dict[str, dict], host: Host) -> bool:
    return bool(facts.get(host.host, {}).get("dirs", {}).get(etcd.DATA_DIR))


def problems(inventory: Inventory, facts: dict[str, dict]) -> list[str]:
    """One line per reason the inventory's coordinators cannot be made the cluster's as it stands."""
    on_etcd = [h for h in inventory.hosts if _has_data(facts, h)
               and facts[h.host].get("env", {}).get(etcd.ETCD_ENV_FILE, {}).get("ETCD_INITIAL_CLUSTER") is not None]
    if not inventory.on_etcd:
        return [f"{h.host}: holds an etcd member of the cluster; the inventory names one coordinator, without etcd, "
                f"and `up` does not move the cluster's records off etcd" for h in on_etcd]
    sqlite = [h.host for h in inventory.coordinators if _on_sqlite(facts, h)]
    if len(sqlite) > 1:
        return [f"{', '.join(sqlite)}: each holds a coordinator's SQLite store ({COORDINATOR_STORE}), and only one "
                f"can move to etcd: `tfcluster down --purge` the others first"]
    if not any(h.coordinator for h in on_etcd):  # a new cluster, or one coordinator's becoming three
        joined = [h.host for h in inventory.agents if facts.get(h.host, {}).get("joined")]
        return [f"{', '.join(joined)}: joined a cluster none of whose coordinators the inventory names (no "
                f"coordinator host holds an etcd member or the cluster's SQLite store): replace at most two "
                f"coordinators at a time, or `tfcluster down --purge` these nodes to make a new cluster"
                ] if joined and not sqlite else []
    through, members, errors = _listed(inventory, facts)
    new = [h.host for h in inventory.coordinators if not _has_data(facts, h)]
    if through is None and new:
        return [f"{', '.join(new)}: to add its member, `up` needs etcd's member list, and no member answered: "
                + "; ".join(errors)]
    if through is not None and not any(m.peer_url == etcd.peer_url(through) for m in members):
        return [f"{through.host}: its etcd member answered but is not among the members it lists"]
    started = {m.peer_url for m in members if m.name}
    return [f"{h.host}: holds etcd data ({etcd.DATA_DIR}) but is not among etcd's members: a member removed "
            f"while its host was away; clear it first (`tfcluster down --purge` with an inventory naming only that "
            f"host), then run `up` again" for h in inventory.coordinators
            if through is not None and _has_data(facts, h) and etcd.peer_url(h) not in started]


def _on_sqlite(facts: dict[str, dict], host: Host) -> bool:
    exists = facts.get(host.host, {}).get("exists", {})
    return bool(exists.get(COORDINATOR_STORE)) and not exists.get(MOVED_MARK)


def moving_store(inventory: Inventory, facts: dict[str, dict]) -> Host | None:
    """The coordinator host whose SQLite store moves to etcd in this run (one coordinator becoming three), if any.
    Call after problems() found none."""
    if not inventory.on_etcd:
        return None
    return next((h for h in inventory.coordinators if _on_sqlite(facts, h)), None)


def move_steps(inventory: Inventory, host: Host) -> list[Step]:
    """On the single coordinator's host, once the three members serve: its coordinator stopped, its store copied
    into etcd (migrate-store refuses a target that holds records, and reads the copy back), and the mark written."""
    argv = [f"{inventory.software.prefix}/bin/tfcluster", "coordinator", "migrate-store", "--from",
            f"sqlite://{COORDINATOR_STORE}", "--to", etcd.store_url(inventory), *etcd.client_flags()]
    return [stop_step(COORDINATOR_UNIT, "its records move to etcd"),
            Step(f"copy the cluster's records from {COORDINATOR_STORE} into etcd",
                 {"kind": "run", "argv": argv, "what": "tfcluster coordinator migrate-store"}),
            Step(f"write {MOVED_MARK}", write_action(MOVED_MARK, b"the SQLite store beside this file was copied into "
                                                                 b"etcd by `tfcluster up`; it is kept as a backup\n",
                                                     0o600))]


def change(inventory: Inventory, facts: dict[str, dict]) -> Change | None:
    """The members to add and remove, or None where etcd's members are the inventory's (or nobody can say: a
    cluster being made, or one whose members do not answer while every coordinator host holds a member's data).
    Call after problems() found none."""
    through, members, _ = _listed(inventory, facts)
    if not inventory.on_etcd or through is None:
        return None
    wanted = {etcd.peer_url(h) for h in inventory.coordinators}
    if wanted == {m.peer_url for m in members}:
        return None
    joining = tuple(h for h in inventory.coordinators if not _has_data(facts, h))
    return Change(through, tuple(members), joining, tuple(m for m in members if m.peer_url not in wanted))


def initial(inventory: Inventory, facts: dict[str, dict], change: Change | None) -> dict[str, tuple[str, str]]:
    """Each coordinator host's member's (ETCD_INITIAL_CLUSTER, ETCD_INITIAL_CLUSTER_STATE) where it is not the
    inventory's and `new`: as it was made where its member has data (so that it is not rewritten and restarted),
    the members it joins where it joins a running cluster."""
    found = {}
    for host in inventory.coordinators:
        made = facts.get(host.host, {}).get("env", {}).get(etcd.ETCD_ENV_FILE, {})
        if _has_data(facts, host) and made.get("ETCD_INITIAL_CLUSTER"):
            found[host.host] = (made["ETCD_INITIAL_CLUSTER"], made.get("ETCD_INITIAL_CLUSTER_STATE", "new"))
        elif change is not None and host in change.joining:
            found[host.host] = (change.initial_cluster(host), "existing")
    return found


def leaving_host(inventory: Inventory, member: Member) -> Host:
    """How to reach a departing member's host: as the inventory lists it where it stays a node, else by the
    member's name (the host it was brought up as) with the inventory's SSH settings."""
    for host in inventory.hosts:
        if etcd.peer_url(host) == member.peer_url or host.host == member.name:
            return host
    return Host(member.name, inventory.ssh.port)


def add_step(change: Change, host: Host) -> Step:
    return Step(f"add {host.host}'s etcd member ({etcd.peer_url(host)}) through {change.through.host}",
                etcd.member_add(change.through, host))


def remove_step(change: Change, member: Member) -> Step:
    return Step(f"remove {member.name or member.peer_url}'s etcd member through {change.through.host}",
                etcd.member_remove(change.through, member.id))


def stop_coordinator() -> Step:
    return stop_step(COORDINATOR_UNIT)


def retire_steps(inventory: Inventory, host: Host) -> list[Step]:
    """After its member was removed: etcd stopped and its data, files and the CA's key gone from the host (a
    removed member never rejoins with its old data). A host the inventory no longer names loses its agent and
    tfcluster's software too; its agent's state stays, as `down` keeps it."""
    stays = any(h.host == host.host for h in inventory.hosts)
    steps = [stop_step(etcd.ETCD_UNIT)]
    paths = [*etcd.owned_paths(), etcd.TLS_DIR, etcd.DATA_DIR, f"{UNIT_DIR}/{COORDINATOR_UNIT}", CA_DIR,
             COORDINATOR_STATE]
    if not stays:
        steps.append(stop_step(AGENT_UNIT))
        paths += [f"{UNIT_DIR}/{AGENT_UNIT}", ENV_FILE, inventory.software.prefix]
    return steps + [Step(f"remove {', '.join(paths)}", {"kind": "remove", "paths": paths})]
