"""`tfcluster queue` (the pending jobs in the order they will be placed, and why each waits) and `tfcluster
policy` (the policy in force: its file as loaded, where from and when)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from tfcluster.cli.common import CoordinatorOpt, TlsDirOpt, app, ask


@app.command()
def queue(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: {\"total\": N, \"jobs\": [...]}."),
    limit: int = typer.Option(0, "--limit", min=0, help="Show the first N jobs only [default: all]."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Show the pending jobs in the order they will be placed: owner, class, size, why each waits, for how long."""
    from tfcluster import views

    response = ask(coordinator, tls_dir, lambda cluster: cluster.queue(limit).wire)
    now = time.time()
    doc = views.queue_doc(response, now)
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    from tfcluster.columns import table
    from tfcluster.render import how_long

    rows = [[str(q["position"]), q["id"], q["owner"] or "-", q["priority"] or "-", str(q["tasks"]), str(q["gpus"]),
             how_long(q["waiting_seconds"]), q["reason"]] for q in doc["jobs"]]
    title = f"queue: {doc['total']} pending"
    print(table(("#", "job", "owner", "class", "tasks", "GPUs", "waiting", "reason"), rows, title) if rows else title)
    if len(doc["jobs"]) < doc["total"]:
        print(f"showing the first {len(doc['jobs'])} of {doc['total']}")


@app.command()
def policy(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: {\"source\", \"loaded_at\", "
                                                       "\"text\"}."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Show the policy in force: the file the coordinator loaded (`--policy`, reloaded on SIGHUP), and when."""
    from tfcluster import views

    response = ask(coordinator, tls_dir, lambda cluster: cluster.policy())
    if as_json:
        print(json.dumps(views.policy_doc(response.wire), indent=2))
        return
    if not response.source:
        print("no policy: one priority class, no quotas; jobs are placed first come, first placed "
              "(start the coordinator with --policy FILE to set one)")
        return
    loaded = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(response.loaded_at))
    print(f"# policy loaded from {response.source} at {loaded}")
    print(response.text, end="" if response.text.endswith("\n") else "\n")
