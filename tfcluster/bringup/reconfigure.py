"""Carries out a change of the coordinators during `up`.

One coordinator becoming three (move_store): the three etcd members started, the single coordinator's records
copied into etcd, then the three coordinators started on it.

A change of the three (membership.Change, carry_out): each departing host's coordinator stopped; each joining
host's member added through a member that stays and the host brought up (its etcd healthy, its coordinator a
standby), one host at a time; then each departing host's member removed and etcd taken off it. The coordinators
that stay are restarted afterwards with the new members, one by one (converge.roll), and the agents with the new
coordinators' addresses.

A departing host that cannot be reached (a dead server being replaced) still has its member removed, first: the
others keep their quorum without it. `up` then says what to do on that host before it comes back, since its
coordinator would still hold a certificate etcd trusts.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from tfcluster.bringup import etcd, membership
from tfcluster.bringup import plan as planning
from tfcluster.bringup.applying import Failed, Run, apply, apply_steps_on
from tfcluster.bringup.desired import CA_DIR, COORDINATOR_UNIT
from tfcluster.bringup.inventory import Host, Inventory
from tfcluster.bringup.plan import Step
from tfcluster.bringup.ssh import Connections, SshError

ApplySteps = Callable[[Host, list[Step]], None]     # applying.apply_steps_on one host, raising Failed
BringUp = Callable[[Host], None]                    # applying.apply of the host's whole plan


def with_dead_members(inventory: Inventory, ssh: Connections,
                      change: membership.Change | None) -> membership.Change | None:
    """The change, knowing which departing hosts do not answer over SSH: their members go first, so the joining
    hosts' initial clusters (written before anything starts) must leave them out."""
    if change is None or not change.leaving:
        return change

    def answers(member: membership.Member) -> bool:
        try:
            return ssh.run(membership.leaving_host(inventory, member), "true").returncode == 0
        except SshError:
            return False
    return replace(change, dead=frozenset(m.id for m in change.leaving if not answers(m)))


def move_store(run: Run, ssh: Connections, hosts: list[Host], plans: dict[str, planning.HostPlan],
               wheelhouses: dict[tuple[str, str], Path], moving: Host) -> None:
    """One coordinator becoming three: every coordinator host brought up to its coordinator's start (etcd's three
    members serving), the single coordinator's records moved into etcd (membership.move_steps), then the
    coordinators started on etcd. Agents keep their tasks while no coordinator serves, as over any restart."""
    parts = {h.host: planning.until_starts(plans[h.host], COORDINATOR_UNIT) for h in hosts}
    for h in hosts:
        plans[h.host].steps = parts[h.host][0]
    apply(run, ssh, hosts, plans, wheelhouses, {})
    apply_steps_on(ssh, moving, membership.move_steps(run.inventory, moving))
    run.say(f"{moving.host}: the cluster's records were copied from SQLite into etcd and checked")
    for h in hosts:
        plans[h.host].steps, plans[h.host].needs_wheelhouse = parts[h.host][1], False
    apply(run, ssh, hosts, plans, wheelhouses, {})


def carry_out(run: Run, ssh: Connections, change: membership.Change, plans: dict[str, planning.HostPlan],
              wheelhouses: dict[tuple[str, str], Path]) -> None:
    """The change of the three carried out (change_members), each joining host brought up by its plan."""
    steps_on = lambda host, steps: apply_steps_on(ssh, host, steps)  # noqa: E731
    bring_up = lambda host: apply(run, ssh, [host], plans, wheelhouses, {})  # noqa: E731
    for warning in change_members(run.inventory, change, steps_on, bring_up, (Failed,), run.say):
        run.say(f"warning: {warning}")


def change_members(inventory: Inventory, change: membership.Change, apply_steps: ApplySteps, bring_up: BringUp,
                   errors: tuple[type, ...], say: Callable[[str], None]) -> list[str]:
    """The whole change. The members of departing hosts that did not answer over SSH (change.dead) are removed
    first, before any host joins: a dead member would otherwise count in the grown cluster's quorum while the new
    member starts (three members with one dead, plus one starting, is two of four). The others stop their
    coordinator first, and lose their member and etcd once every new host has joined. Returns a warning for each
    host not cleared."""
    reached, unreached, warnings = {}, {}, []
    for member in change.leaving:
        host = membership.leaving_host(inventory, member)
        if member.id in change.dead:
            apply_steps(change.through, [membership.remove_step(change, member)])
            warnings.append(_unreached(host, "it did not answer over SSH"))
            continue
        try:
            apply_steps(host, [membership.stop_coordinator()])
            reached[host] = member
        except errors as e:
            unreached[host] = (member, e)
    join(change, apply_steps, bring_up, say)
    for host, member in reached.items():
        apply_steps(change.through, [membership.remove_step(change, member)])
        try:
            apply_steps(host, membership.retire_steps(inventory, host))
            say(f"{host.host}: its etcd member was removed, and etcd, the coordinator and the CA's key are off it")
        except errors as e:
            warnings.append(_unreached(host, e))
    for host, (member, error) in unreached.items():
        apply_steps(change.through, [membership.remove_step(change, member)])
        warnings.append(_unreached(host, error))
    return warnings


def join(change: membership.Change, apply_steps: ApplySteps, bring_up: BringUp, say: Callable[[str], None]) -> None:
    """Adds and starts each joining host's member, one at a time: etcd refuses to add a member while another
    added one has not started, as the quorum would then count a member that cannot vote."""
    for host in change.joining:
        if not change.added(host):
            apply_steps(change.through, [membership.add_step(change, host)])
        bring_up(host)
        say(f"{host.host}: its etcd member joined and its coordinator serves as a standby")


def _unreached(host: Host, error: object) -> str:
    return (f"{host.host}: its etcd member was removed, but the host could not be cleared ({error}); before it runs "
            f"again, stop {COORDINATOR_UNIT} and {etcd.ETCD_UNIT} there and remove {CA_DIR}, {etcd.TLS_DIR} and "
            f"{etcd.DATA_DIR} (`tfcluster down --purge` with an inventory naming it does)")
