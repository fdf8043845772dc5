"""`tfcluster up` and `tfcluster down`: a whole cluster over SSH from an inventory file (tfcluster.bringup)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tfcluster.cli.common import app, fail, out

InventoryArg = typer.Argument(..., metavar="CLUSTER.TOML", help="The inventory: [ssh], [software], "
                                                                "[[coordinators]] and [[nodes]].")
OperatorDirOpt = typer.Option(None, "--operator-dir", metavar="DIR",
                              help="Where the cluster's CA and the admin's credentials are kept "
                                   "[default: CLUSTER.tfcluster beside the inventory].")


BatchOpt = typer.Option(2, "--batch", min=1, metavar="N", help="Agents upgraded at a time, when their software "
                                                                "changes while they run.")


def _load(path: Path, operator_dir: Optional[Path], check: bool, batch: int = 2, upgrade_only: bool = False):
    from tfcluster.bringup.applying import Run
    from tfcluster.bringup.inventory import InventoryError, load

    try:
        inventory = load(path)
    except InventoryError as e:
        fail(str(e), 2)
    directory = operator_dir or path.resolve().with_name(f"{path.stem}.tfcluster")
    return Run(inventory, directory, lambda line: out.print(line, markup=False), check=check, batch=batch,
               upgrade_only=upgrade_only)


@app.command()
def up(
    inventory: Path = InventoryArg,
    check: bool = typer.Option(False, "--check", help="Print what would change on each host; change nothing."),
    operator_dir: Optional[Path] = OperatorDirOpt,
    batch: int = BatchOpt,
) -> None:
    """Bring the cluster up over SSH, as the inventory says: software in a virtualenv, the CA's certificates, the
    units, each agent joined with a single-use token; then wait until every node is READY. Running it again
    changes only what differs; hosts running another build are upgraded in turn, as `tfcluster upgrade` does."""
    _up(_load(inventory, operator_dir, check, batch))


@app.command()
def upgrade(
    inventory: Path = InventoryArg,
    check: bool = typer.Option(False, "--check", help="Print what would change and the releases' check; change "
                                                      "nothing."),
    operator_dir: Optional[Path] = OperatorDirOpt,
    batch: int = BatchOpt,
) -> None:
    """Rolling upgrade to this checkout's build (or the index's release): the coordinators one at a time
    (standbys, then the leader), then the agents --batch at a time, each group back before the next stops;
    running tasks keep running. Releases that cannot work together are refused before anything stops."""
    _up(_load(inventory, operator_dir, check, batch, upgrade_only=True))


def _up(run) -> None:
    from tfcluster.bringup.ca import admin_dir
    from tfcluster.bringup.applying import Failed
    from tfcluster.bringup.converge import up as bring_up

    try:
        table = bring_up(run)
    except Failed as e:
        fail(str(e), 1)
    if table is None:
        return
    from tfcluster.columns import table as columns

    print(columns(["host", "role", "state", "gpus", "version", "seconds"], table))
    out.print(f"admin credentials: export TFCLUSTER_TLS_DIR={admin_dir(run.operator_dir)} "
              f"TFCLUSTER_COORDINATOR={run.inventory.coordinator_address}", markup=False)


@app.command()
def down(
    inventory: Path = InventoryArg,
    purge: bool = typer.Option(False, "--purge", help="Also remove the state (jobs, node certificates), the "
                                                      "configuration and the logs on each host."),
    check: bool = typer.Option(False, "--check", help="Print what would be removed; remove nothing."),
    operator_dir: Optional[Path] = OperatorDirOpt,
) -> None:
    """Stop the services `tfcluster up` started and remove their units and the virtualenv; each host's state and
    certificates stay unless --purge (the operator's CA stays either way)."""
    from tfcluster.bringup.applying import Failed
    from tfcluster.bringup.teardown import down as take_down

    run = _load(inventory, operator_dir, check)
    try:
        changed = take_down(run, purge)
    except Failed as e:
        fail(str(e), 1)
    if not check:
        out.print(f"{changed} host(s) changed" if changed else "nothing to remove", markup=False)
