"""`up` and `down` from start to end: probe every host, make the CA once, build the software, plan each host,
apply the plans (coordinators first, then agents, each with a join token made for it), and wait until every node
is READY. Hosts are handled in parallel; a host that fails is named with its step and what to do, and the others
go on."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from tfcluster.bringup import plan as planning
from tfcluster.bringup.desired import AGENT_UNIT, COORDINATOR_UNIT, JOIN_TOKEN_FILE, NODE_CERT_PATH, WHEELHOUSE_DIR
from tfcluster.bringup.desired import desired, owned_paths
from tfcluster.bringup.inventory import Host, Inventory
from tfcluster.bringup.ssh import Connections, SshError
from tfcluster.bringup.wheelhouse import WheelhouseError, cache_dir, checkout, software_id, wheelhouse
from tfcluster.errors import ClusterError

JOIN_TOKEN_TTL_SECONDS = 3600
READY_TIMEOUT_SECONDS = 180
POLL_SECONDS = 0.5


class Failed(Exception):
    """`up` or `down` could not finish; the message names the host, the step and the remedy."""


@dataclass
class Run:
    inventory: Inventory
    operator_dir: Path                 # the CA and the admin's credentials live here
    say: Callable[[str], None]
    check: bool = False
    started: float = field(default_factory=time.monotonic)
    facts: dict[str, dict] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def each(self, hosts, work: Callable[[Host], object]) -> dict[str, object]:
        """work(host) for each host in parallel; a host whose work raised SshError/Failed is recorded as failed."""
        results: dict[str, object] = {}

        def guarded(host: Host):
            try:
                results[host.host] = work(host)
            except (SshError, Failed) as e:
                self.failures.append(f"{host.host}: {e}")
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as pool:
            list(pool.map(guarded, hosts))
        return results

    def stop_on_failures(self, during: str) -> None:
        if self.failures:
            raise Failed(f"{during} failed on {len(self.failures)} host(s):\n  " + "\n  ".join(self.failures))


def probe(run: Run, ssh: Connections) -> None:
    inv = run.inventory
    run.facts = run.each(inv.hosts, lambda h: ssh.helper(h, {
        "op": "probe", "prefix": inv.software.prefix, "files": owned_paths(inv, h), "node_cert": NODE_CERT_PATH,
        "services": [s for s, on in ((COORDINATOR_UNIT, h.coordinator), (AGENT_UNIT, h.agent)) if on],
        "dirs": planning.probed_dirs(inv.software)}))
    run.stop_on_failures("probing (step: ssh and python3)")


def node_name(run: Run, host: Host) -> str:
    return host.name or run.facts[host.host]["hostname"]


def with_addresses(inv: Inventory) -> Inventory:
    """The inventory with each agent's advertise address filled in where it was left out: the address its host
    resolves to here (the agent's own guess, the interface towards the coordinator, can be another one)."""
    hosts = []
    for h in inv.hosts:
        if h.agent and h.advertise_address is None:
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
        ca_files = ca.files(run.operator_dir, inv, create=not run.check)
        ids = software_ids(run)
        plans = {h.host: planning.plan_up(h, desired(inv, h, ca_files), run.facts[h.host], inv.software,
                                          ids[h.host]) for h in inv.hosts}
        for h in inv.hosts:
            changes = plans[h.host].changes
            run.say(f"{h.host} ({h.roles}): " + ("as it should be" if not changes else "\n  " + "\n  ".join(changes)))
        if run.check:
            return None
        if not any(p.changes for p in plans.values()):
            run.say(f"nothing to change: {len(inv.hosts)} host(s) are as {inv.source} says")
        if any(not f["systemd"] for f in run.facts.values()):
            hosts = ", ".join(h.host for h in inv.hosts if not run.facts[h.host]["systemd"])
            run.say(f"no systemd runs {hosts}: the units' command lines run there as background daemons (pid files "
                    f"in /run/tfcluster, logs in /var/log/tfcluster), which nothing restarts if they die")
        wheelhouses = build_wheelhouses(run, plans)
        apply(run, ssh, [h for h in inv.hosts if h.coordinator], plans, wheelhouses, {})
        tokens = join_tokens(run, [h for h in inv.hosts if h.agent and plans[h.host].needs_token])
        apply(run, ssh, [h for h in inv.hosts if not h.coordinator], plans, wheelhouses, tokens)
        table = wait_ready(run)
        joined = [h for h in inv.hosts if h.host in tokens]
        run.each(joined, lambda h: apply_steps(ssh, h, [planning.Step(
            f"remove {JOIN_TOKEN_FILE}", {"kind": "remove", "paths": [JOIN_TOKEN_FILE]})]))
        return table


def software_ids(run: Run) -> dict[str, str]:
    root = checkout() if run.inventory.software.source == "wheelhouse" else None
    if run.inventory.software.source == "wheelhouse" and root is None:
        raise Failed("no source checkout to build a wheelhouse from; remedy: run `tfcluster up` from a clone, or "
                     "set [software] source = \"index\" and index_url")
    return {host: software_id(run.inventory.software, f["python"], f["machine"], root)
            for host, f in run.facts.items()}


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


def apply(run: Run, ssh: Connections, hosts: list[Host], plans: dict[str, planning.HostPlan],
          wheelhouses: dict[tuple[str, str], Path], tokens: dict[str, str]) -> None:
    def one(host: Host) -> None:
        plan = plans[host.host]
        if plan.needs_wheelhouse:
            facts = run.facts[host.host]
            try:
                ssh.send_tree(host, wheelhouses[(facts["python"], facts["machine"])], WHEELHOUSE_DIR)
            except SshError as e:
                raise Failed(f"step copy the wheelhouse: {e}") from None
        steps = planning.with_token(plan, tokens[host.host]) if host.host in tokens else plan.steps
        apply_steps(ssh, host, steps)
    run.each([h for h in hosts if plans[h.host].steps or h.host in tokens], one)
    run.stop_on_failures("applying")


def apply_steps(ssh: Connections, host: Host, steps: list[planning.Step]) -> None:
    if not steps:
        return
    answer = ssh.helper(host, {"op": "apply", "steps": [dict(s.action, name=s.name) for s in steps]})
    if "failed" in answer:
        left = [s.name for s in steps][len(answer["done"]):]
        raise Failed(f"step {answer['failed']!r} failed: {answer['error']}\n    done: {len(answer['done'])} step(s); "
                     f"not done: {', '.join(left)}\n    remedy: fix the cause, then run `tfcluster up` again: it "
                     f"redoes only what is not done")


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


def down(run: Run, purge: bool) -> int:
    """Stops and removes what `up` installed on each host; the number of hosts changed."""
    inv = run.inventory
    with Connections(inv.ssh) as ssh:
        probe(run, ssh)
        plans = {h.host: planning.plan_down(h, run.facts[h.host], inv.software, purge) for h in inv.hosts}
        for h in inv.hosts:
            changes = plans[h.host].changes
            run.say(f"{h.host} ({h.roles}): " + ("nothing of tfcluster there" if not changes
                                                 else "\n  " + "\n  ".join(changes)))
        if run.check:
            return 0
        agents_first = [h for h in inv.hosts if not h.coordinator] + list(inv.coordinators)
        for group in (agents_first[:len(inv.hosts) - len(inv.coordinators)], list(inv.coordinators)):
            run.each(group, lambda h: apply_steps(ssh, h, plans[h.host].steps))
        run.stop_on_failures("down")
    return sum(1 for p in plans.values() if p.steps)
