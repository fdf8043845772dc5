"""Commands run on a node itself, without the coordinator: `tfcluster gc`. The retention options live here and
`tfcluster agent` shares them, so the agent's passes and a hand-run gc follow the same settings."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from tfcluster.cli.common import app, default_state_dir, err, fail, out, parse_duration, parse_size

RetainForOpt = typer.Option("7d", metavar="DURATION",
                            help="Keep an ended job's files (attempts, logs, host-local checkpoints) this long "
                                 "after they were last written, e.g. 12h or 30d.")
RetainBytesOpt = typer.Option("50G", metavar="SIZE",
                              help="Remove ended jobs' files, oldest first, while the jobs on this node take more "
                                   "than this, e.g. 500M, 50G, 2T.")
MinFreeDiskOpt = typer.Option("1G", metavar="SIZE",
                              help="Below this much free disk under the state dir the node takes no new tasks "
                                   "and ended jobs' files go first; 0: no floor.")


def retention_policy(retain_for: str, retain_bytes: str, min_free_disk: str):
    """The retention flags, checked (a bad one fails the command with exit code 2)."""
    from tfcluster.daemon.agent.node.retention import Policy

    return Policy(retain_for=parse_duration(retain_for, "--retain-for"),
                  retain_bytes=parse_size(retain_bytes, "--retain-bytes"),
                  min_free_bytes=0 if min_free_disk.strip() == "0" else parse_size(min_free_disk, "--min-free-disk"))


@app.command()
def gc(
    state_dir: Optional[Path] = typer.Option(None, help="The agent's state dir "
                                                        "[default: /var/lib/tfcluster/agent as root, else "
                                                        "~/.local/state/tfcluster/agent]."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be removed, remove nothing."),
    retain_for: str = RetainForOpt,
    retain_bytes: str = RetainBytesOpt,
    min_free_disk: str = MinFreeDiskOpt,
) -> None:
    """Remove what this node's retention allows: ended jobs' files, and older attempts and checkpoints of jobs
    that are not running here. Prints each (path, size, why) and the total. Safe while the agent runs: jobs with
    a running task are left alone, and jobs count as ended only once the agent has learned so."""
    from tfcluster.daemon.agent.node.retention import free_bytes, human_size, plan, remove, scan

    policy = retention_policy(retain_for, retain_bytes, min_free_disk)
    # Resolved as the agent resolves its own: a running task is recognised by its shim's attempt path.
    state_dir = (state_dir or default_state_dir("agent")).resolve()
    if not state_dir.is_dir():
        fail(f"--state-dir {state_dir}: no such directory", 2)
    removals = plan(scan(state_dir), policy, time.time(), free_bytes(state_dir))
    for removal in removals:
        out.print(f"{human_size(removal.size):>10}  {removal.shown}  ({removal.reason})", markup=False, soft_wrap=True)
    total = sum(r.size for r in removals)
    if dry_run:
        out.print(f"would remove {len(removals)} items, {human_size(total)} (dry run: nothing removed)", markup=False)
        return
    freed, errors = remove(removals)
    for error in errors:
        err.print(f"error: could not remove {error}", markup=False)
    out.print(f"removed {len(removals)} items, {human_size(freed)} freed", markup=False)
    if errors:
        raise typer.Exit(1)
