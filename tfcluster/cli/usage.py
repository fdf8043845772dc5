"""`tfcluster usage`: what each user and each group used, from the coordinator's usage ledger."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from tfcluster.cli.common import CoordinatorOpt, TlsDirOpt, app, connect, fail, out, parse_duration
from tfcluster.client import ClientError


@app.command()
def usage(
    since: str = typer.Option("7d", metavar="DURATION",
                              help="The window: the last 12h, 7d, 30d...; 0: everything the coordinator keeps "
                                   "(its --keep-usage-for)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: {\"users\": [...], \"groups\": "
                                                       "[...], \"since\": ..., \"until\": ...}."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """GPU-hours, CPU-hours, peak memory and jobs per user and per group over a window (running jobs up to
    now). Anyone who may read the cluster sees every user's totals."""
    window = parse_duration(since, "--since")
    with connect(coordinator, tls_dir) as client:
        try:
            report = client.usage(window)
        except ClientError as e:
            fail(str(e), e.exit_code)
    if as_json:
        from tfcluster import wire

        print(json.dumps(wire.usage_doc(report), indent=2))
        return
    from tfcluster.render import render_usage

    out.print(render_usage(report))
