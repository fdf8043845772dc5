"""`tfcluster down`: stops and removes what `up` installed, agents first, then the coordinators (each host's
services in the reverse of their start order), keeping each host's state unless --purge."""

from __future__ import annotations

from tfcluster.bringup import plan as planning
from tfcluster.bringup.applying import Run, apply_steps
from tfcluster.bringup.converge import probe
from tfcluster.bringup.desired import services
from tfcluster.bringup.ssh import Connections


def down(run: Run, purge: bool) -> int:
    """Stops and removes what `up` installed on each host; the number of hosts changed."""
    inv = run.inventory
    with Connections(inv.ssh) as ssh:
        probe(run, ssh)
        plans = {h.host: planning.plan_down(h, services(inv, h), run.facts[h.host], inv.software, purge)
                 for h in inv.hosts}
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
