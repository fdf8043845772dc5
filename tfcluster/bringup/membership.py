"""Whether the inventory's coordinators are the ones the cluster was made with. `up` makes etcd's members once,
from the inventory (ETCD_INITIAL_CLUSTER counts only at a member's first start), and a single coordinator keeps
the cluster's state in SQLite on its host. So a coordinator added to, removed from or moved in the inventory of
a running cluster would leave a member that never joins, or a new etcd beside the old state. `up` does not change
etcd's membership or move a SQLite store onto etcd: it refuses such a change before anything is written, saying
what the cluster was made with and how to change it by hand (docs/operators.md#changing-the-coordinators).

Pure: the probe's facts come in (remote.probe: `dirs`, `exists`, `env`), the problems go out.
"""

from __future__ import annotations

from tfcluster import layout
from tfcluster.bringup import etcd
from tfcluster.bringup.hostfiles import STATE_DIR
from tfcluster.bringup.inventory import Inventory

COORDINATOR_STORE = f"{STATE_DIR}/coordinator/{layout.COORDINATOR_DB}"  # the coordinator unit's --state-dir
REMEDY = ("nothing was changed; remedy: list the coordinators the cluster was made with, or change them by hand "
          "first (docs/operators.md#changing-the-coordinators)")


def probe_request() -> dict:
    """What the probe must report for problems() (merged into each host's probe request)."""
    return {"exists": [COORDINATOR_STORE], "env_files": [etcd.ETCD_ENV_FILE]}


def problems(inventory: Inventory, facts: dict[str, dict]) -> list[str]:
    """One line per host whose etcd member or SQLite store says the cluster has other coordinators."""
    wanted = etcd.initial_cluster(inventory) if inventory.on_etcd else ""
    found = []
    for host in inventory.hosts:
        f = facts.get(host.host, {})
        made = f.get("env", {}).get(etcd.ETCD_ENV_FILE, {}).get("ETCD_INITIAL_CLUSTER")
        if f.get("dirs", {}).get(etcd.DATA_DIR) and made is not None and made != wanted:
            found.append(f"{host.host}: its etcd member was made with the coordinators {_names(made)}; the "
                         f"inventory names {_names(wanted) or 'one coordinator, without etcd'}")
        elif inventory.on_etcd and host.coordinator and f.get("exists", {}).get(COORDINATOR_STORE):
            found.append(f"{host.host}: its coordinator keeps the cluster's state in SQLite ({COORDINATOR_STORE}); "
                         f"three coordinators keep it on etcd, and `up` does not move it there")
    return found


def _names(initial_cluster: str) -> str:
    return ", ".join(member.split("=", 1)[0] for member in initial_cluster.split(",") if member)
