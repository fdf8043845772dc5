"""`up` from start to end: probe every host, make the CA once, build the software, plan each host, apply the plans
(coordinators first, then agents, each with a join token made for it), and wait until every node is READY.
Hosts are handled in parallel (applying.py); a host that fails is named with its step and what to do, and the
others go on. A change of the coordinators goes through reconfigure.py, a new release through upgrade.py."""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from pathlib import Path

from tfcluster.bringup import etcd, membership
from tfcluster.bringup import plan as planning
from tfcluster.bringup import reconfigure, upgrade
from tfcluster.bringup.applying import Failed, Run, apply, apply_steps
from tfcluster.bringup.desired import AGENT_UNIT, COORDINATOR_UNIT, JOIN_TOKEN_FILE, NODE_CERT_PATH
from tfcluster.bringup.desired import desired, owned_paths, services
from tfcluster.bringup.etcd import ETCD_BINARY, INSTALL_REMEDY
from tfcluster.bringup.inventory import Host, Inventory
from tfcluster.bringup.ssh import Connections
from tfcluster.bringup.wheelhouse import WheelhouseError, cache_dir, checkout, software_id, wheelhouse
from tfcluster.errors import ClusterError

JOIN_TOKEN_TTL_SECONDS = 3600
READY_TIMEOUT_SECONDS = 180
POLL_SECONDS = 0.5


def probe(run: Run, ssh: Connections) -> None:
    inv = run.inventory
    run.facts = run.each(inv.hosts, lambda h: ssh.helper(h, {
        "op": "probe", "prefix": inv.software.prefix, "files": owned_paths(inv, h), "node_cert": NODE_CERT_PATH,
        "services": services(inv, h), "dirs": [*planning.probed_dirs(inv.software), etcd.DATA_DIR],
        "programs": [ETCD_BINARY] if h.coordinator and inv.on_etcd else [], **membership.probe_request(inv, h)}))
    run.stop_on_failures("probing (step: ssh and python3)")


def check_programs(run: Run) -> None:
    """Refuses, before anything changes, coordinator hosts without etcd when there are three."""
    missing = [h.host for h in run.inventory.coordinators
               if not run.facts[h.host].get("programs", {}).get(ETCD_BINARY, True)]
    if missing:
        raise Failed(f"{', '.join(missing)}: step check etcd: three coordinators keep the cluster on etcd, and "
                     f"there is no {ETCD_BINARY}; nothing was changed; remedy: {INSTALL_REMEDY} on each, then run "
                     f"`tfcluster up` again")


def node_name(run: Run, host: Host) -> str:
    return host.name or run.facts[host.host]["hostname"]


def with_addresses(inv: Inventory) -> Inventory:
    """The inventory with each agent's advertise address filled in where it was left out: the address its host
    resolves to here (the agent's own guess, the interface towards the coordinator, can be another one). With
    three coordinators, theirs too: their etcd members listen on it."""
    hosts = []
    for h in inv.hosts:
        if (h.agent or (h.coordinator and inv.on_etcd)) and h.advertise_address is None:
            try:
                h = replace(h, advertise_address=socket.getaddrinfo(h.host, None)[0][4][0])
            except OSError as e:
                raise Failed(f"{h.host}: step resolve its address: {e}; remedy: set advertise_address") from None
        hosts.append(h)
    return replace(inv, hosts=tuple(hosts))


def up(run: Run) -> list[list[str]] | None:
    """Brings the cluster to what the inventory says; the READY table, or None with --check."""
    from tfcluster.bringup import ca

    inv = run.inventory = with_addresses(run.inventory)
    with Connections(inv.ssh) as ssh:
        probe(run, ssh)
        check_programs(run)
        refused = membership.problems(inv, run.facts)
        if refused:
            raise Failed("step check the coordinators: `up` cannot make the inventory's coordinators the "
                         "cluster's:\n  " + "\n  ".join(refused) + f"\n{membership.REMEDY}")
        change = reconfigure.with_dead_members(inv, ssh, membership.change(inv, run.facts))
        initial = membership.initial(inv, run.facts, change)
        ca_files = ca.files(run.operator_dir, inv, create=not run.check)
        etcd_files = ca.etcd_files(run.operator_dir, inv, create=not run.check)
        ids = software_ids(run)
        plans = {h.host: planning.plan_up(h, desired(inv, h, ca_files, etcd_files.get(h.host), initial.get(h.host)),
                                          run.facts[h.host], inv.software, ids[h.host]) for h in inv.hosts}
        if change:
            run.say("the coordinators change:\n  " + "\n  ".join(change.describe()))
        for h in inv.hosts:
            changes = plans[h.host].changes
            run.say(f"{h.host} ({h.roles}): " + ("as it should be" if not changes else "\n  " + "\n  ".join(changes)))
        moving = membership.moving_store(inv, run.facts)
        if moving:
            run.say(f"one coordinator becomes three: {moving.host}'s records move from SQLite to etcd once the "
                    f"three members serve, then the three coordinators start on etcd")
        rolling = [h for h in rolling_hosts(run, plans) if h != moving]  # its coordinator stops anyway
        if run.upgrade_only:
            refuse_bare_hosts(run)
        if rolling:
            check_releases(run, rolling, release(ids))
            run.say(f"rolling upgrade to {release(ids)}: {', '.join(h.host for h in rolling if h.coordinator)}"
                    f"{' then ' if any(h.coordinator for h in rolling) else ''}agents {run.batch} at a time, "
                    f"each group back before the next stops")
        if run.check:
            return None
        if not any(p.changes for p in plans.values()):
            run.say(f"nothing to change: {len(inv.hosts)} host(s) are as {inv.source} says")
        if any(not f["systemd"] for f in run.facts.values()):
            hosts = ", ".join(h.host for h in inv.hosts if not run.facts[h.host]["systemd"])
            run.say(f"no systemd runs {hosts}: the units' command lines run there as background daemons (pid files "
                    f"in /run/tfcluster, logs in /var/log/tfcluster), which nothing restarts if they die")
        tokens = converge(run, ssh, plans, rolling, release(ids), change, moving)
        table = wait_ready(run)
        joined = [h for h in inv.hosts if h.host in tokens]
        run.each(joined, lambda h: apply_steps(ssh, h, [planning.Step(
            f"remove {JOIN_TOKEN_FILE}", {"kind": "remove", "paths": [JOIN_TOKEN_FILE]})]))
        return table


def converge(run: Run, ssh: Connections, plans: dict[str, planning.HostPlan], rolling: list[Host],
             new: str, change: membership.Change | None = None, moving: Host | None = None) -> dict[str, str]:
    """Applies the plans: coordinators first (a rolling upgrade one by one; with a change of the coordinators,
    reconfigure.py's order, then those that stay one by one), then the agents with the join tokens their
    coordinator makes. Returns those tokens, by host."""
    inv = run.inventory
    wheelhouses = build_wheelhouses(run, plans)
    coordinators, agents = list(inv.coordinators), [h for h in inv.hosts if not h.coordinator]
    # A coordinator host that is also a node joins after its coordinator serves, with the other agents.
    joining_later = [h for h in coordinators if h.agent and plans[h.host].needs_token and h not in rolling]
    later = {h.host: planning.until_agent_starts(plans[h.host]) for h in joining_later}
    for host, (now, _) in later.items():
        plans[host].steps = now
    joining = change.joining if change else ()
    restarting = [h for h in coordinators if change and h not in joining and h.host not in later
                  and plans[h.host].steps and any(run.facts[h.host]["running"].values())]
    first = [h for h in coordinators if h not in rolling and h not in joining and h not in restarting]
    if moving:
        reconfigure.move_store(run, ssh, first, plans, wheelhouses, moving)
    else:
        apply(run, ssh, first, plans, wheelhouses, {})
    if change:
        reconfigure.carry_out(run, ssh, change, plans, wheelhouses)
    roll(run, ssh, [h for h in coordinators if h in rolling or h in restarting], plans, wheelhouses, new)
    tokens = join_tokens(run, [h for h in inv.hosts if h.agent and plans[h.host].needs_token])
    for host, (_, then) in later.items():
        plans[host].steps, plans[host].needs_wheelhouse = then, False  # its software is installed
    apply(run, ssh, joining_later + [h for h in agents if h not in rolling], plans, wheelhouses, tokens)
    roll(run, ssh, [h for h in agents if h in rolling], plans, wheelhouses, new)
    return tokens


def software_ids(run: Run) -> dict[str, str]:
    root = checkout() if run.inventory.software.source == "wheelhouse" else None
    if run.inventory.software.source == "wheelhouse" and root is None:
        raise Failed("no source checkout to build a wheelhouse from; remedy: run `tfcluster up` from a clone, or "
                     "set [software] source = \"index\" and index_url")
    return {host: software_id(run.inventory.software, f["python"], f["machine"], root)
            for host, f in run.facts.items()}


def release(ids: dict[str, str]) -> str:
    """The release this run installs (every host gets the same)."""
    return upgrade.release(next(iter(ids.values())))


def rolling_hosts(run: Run, plans: dict[str, planning.HostPlan]) -> list[Host]:
    """The hosts whose daemons run while their software changes: an upgrade, done a group at a time."""
    return [h for h in run.inventory.hosts if plans[h.host].installs and any(run.facts[h.host]["running"].values())]


def refuse_bare_hosts(run: Run) -> None:
    bare = [h.host for h in run.inventory.hosts if not any(run.facts[h.host]["running"].values())]
    if bare:
        raise Failed(f"step check that every host is up: nothing of tfcluster runs on {', '.join(bare)}, nothing "
                     f"was changed; remedy: `tfcluster up {run.inventory.source}` brings them up (and upgrades the "
                     f"others the same way)")


def check_releases(run: Run, rolling: list[Host], new: str) -> None:
    """Refuses, before anything stops, a release that cannot work with what runs (upgrade.refusals)."""
    installed = {host: upgrade.release(f["software"]) for host, f in run.facts.items() if f.get("software")}
    registered = {}
    if any(run.facts[h.host]["running"].get(COORDINATOR_UNIT) for h in run.inventory.coordinators):
        try:
            with admin_client(run) as client:
                registered = {n.name: n.agent_version for n in client.nodes()}
        except ClusterError as e:
            raise Failed(f"coordinator {run.inventory.coordinator_address}: step read the agents' releases before "
                         f"the upgrade: {e}; remedy: bring the coordinator back (`tfcluster up` does), then "
                         f"upgrade") from None
    problems = upgrade.refusals(new, installed, registered, {node_name(run, h) for h in rolling if h.agent})
    if problems:
        raise Failed(f"step check the releases: {new} is refused, nothing was stopped:\n  " + "\n  ".join(problems))


def roll(run: Run, ssh: Connections, hosts: list[Host], plans: dict[str, planning.HostPlan],
         wheelhouses: dict[tuple[str, str], Path], new: str) -> None:
    """Upgrades hosts one group at a time (coordinators one by one, standbys first; agents run.batch at a time),
    each group back with its tasks still running before the next one stops."""
    if not hosts:
        return
    coordinators = hosts[0].coordinator
    with admin_client(run) as client:
        wait_serving(run, client)
        groups = ([[h] for h in upgrade.coordinator_order(hosts, client.status().summary.leader)] if coordinators
                  else upgrade.batches(hosts, run.batch))
        for i, group in enumerate(groups):
            by_node = upgrade.running_tasks(client)
            expect = {node_name(run, h): new for h in group if h.agent}
            if coordinators:  # every node must find the restarted coordinator again, with its tasks
                expect = {n.name: "" for n in client.nodes() if n.state == "READY"} | expect
            tasks = set().union(*(by_node.get(name, set()) for name in expect))
            stopped = time.monotonic()
            apply(run, ssh, group, plans, wheelhouses, {})
            names = ", ".join(h.host for h in group)
            try:
                if coordinators:
                    wait_serving(run, client)
                upgrade.wait_back(client, expect, tasks, f"{names} after its restart on {new}")
            except (TimeoutError, RuntimeError) as e:
                left = [h.host for g in groups[i + 1:] for h in g]
                raise Failed(f"step wait until back: {e}\n    upgraded: {names} and the groups before; left on the "
                             f"old release: {', '.join(left) or 'none'}\n    remedy: read the logs there (journalctl "
                             f"-u {AGENT_UNIT} / {COORDINATOR_UNIT}, or /var/log/tfcluster), then run the upgrade "
                             f"again: it goes on with the hosts left") from None
            done = (f"upgraded {names} ({group[0].roles}) to {new}: installed, restarted" if plans[group[0].host].installs
                    else f"restarted {names} ({group[0].roles}) with its new configuration")
            run.say(f"{done} and back in {time.monotonic() - stopped:.1f} s; {len(tasks)} running task(s) kept "
                    f"running")


def build_wheelhouses(run: Run, plans: dict[str, planning.HostPlan]) -> dict[tuple[str, str], Path]:
    targets = {(run.facts[h]["python"], run.facts[h]["machine"]) for h, p in plans.items() if p.needs_wheelhouse}
    built = {}
    for python, machine in sorted(targets):
        run.say(f"the wheelhouse for Python {python} on {machine}: built from {checkout()} once, then kept in "
                f"{cache_dir()}")
        try:
            built[(python, machine)], _ = wheelhouse(run.inventory.software, python, machine)
        except WheelhouseError as e:
            raise Failed(f"operator: step build the wheelhouse: {e}") from None
    return built


def join_tokens(run: Run, agents: list[Host]) -> dict[str, str]:
    """A single-use token for each agent that has not joined, bound to its node's name."""
    if not agents:
        return {}
    tokens = {}
    with admin_client(run) as client:
        wait_serving(run, client)
        for host in agents:
            try:
                tokens[host.host], _ = client.create_join_token(JOIN_TOKEN_TTL_SECONDS, node_name(run, host))
            except ClusterError as e:
                raise Failed(f"{host.host}: step make a join token: {e}") from None
    return tokens


def admin_client(run: Run):
    from tfcluster.bringup.ca import admin_dir
    from tfcluster.cluster import Cluster

    return Cluster(run.inventory.coordinator_address, admin_dir(run.operator_dir))


def wait_serving(run: Run, client) -> None:
    deadline, error = time.monotonic() + READY_TIMEOUT_SECONDS, None
    while time.monotonic() < deadline:
        try:
            client.status()
            return
        except ClusterError as e:
            error = e
            time.sleep(POLL_SECONDS)
    raise Failed(f"coordinator {run.inventory.coordinator_address}: step wait until it serves: {error}; remedy: "
                 f"read its log (journalctl -u {COORDINATOR_UNIT}, or /var/log/tfcluster/{COORDINATOR_UNIT}.log)")


def wait_ready(run: Run) -> list[list[str]]:
    """Waits until every agent's node is READY with the GPUs the inventory expects; the table's rows (host, role,
    state, GPUs, version, seconds since `up` began)."""
    inv, ready, seen, problem = run.inventory, {}, {}, ""
    names = {node_name(run, h): h for h in inv.agents}
    with admin_client(run) as client:
        wait_serving(run, client)
        serving = f"{run.elapsed():.1f}"
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while any(n not in ready for n in names):
            if time.monotonic() > deadline:
                waiting = ", ".join(f"{n} ({seen[n].state if n in seen else 'never registered'})"
                                    for n in names if n not in ready)
                raise Failed(f"step wait until READY: not READY after {READY_TIMEOUT_SECONDS} s: {waiting} {problem}; "
                             f"remedy: read the agent's log there (journalctl -u {AGENT_UNIT}, or "
                             f"/var/log/tfcluster/{AGENT_UNIT}.log)")
            try:
                seen = {n.name: n for n in client.nodes() if n.name in names}
            except ClusterError as e:
                problem = f"({e})"
            for name, node in seen.items():
                if node.state == "READY" and name not in ready:
                    ready[name] = [names[name].host, names[name].roles, node.state, str(len(node.gpus)),
                                   node.agent_version, f"{run.elapsed():.1f}"]
            time.sleep(0 if all(n in ready for n in names) else POLL_SECONDS)
    check_gpus(inv, names, seen)
    return [ready[node_name(run, h)] if h.agent else [h.host, h.roles, "SERVING", "-", client_version(), serving]
            for h in inv.hosts]


def check_gpus(inv: Inventory, names: dict[str, Host], seen: dict) -> None:
    wrong = [f"{h.host}: expected {h.gpus} GPU(s), the agent found {len(seen[n].gpus)}"
             for n, h in names.items() if h.gpus is not None and len(seen[n].gpus) != h.gpus]
    if wrong:
        raise Failed("step check the GPUs: " + "; ".join(wrong) + "; remedy: check the driver there "
                     "(nvidia-smi), or correct gpus in the inventory")


def client_version() -> str:
    from tfcluster import __version__

    return __version__
