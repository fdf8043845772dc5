"""`tfcluster sweep start | status | stop`: one spec run as many trials (docs/sweeps.md). The coordinator keeps the
sweep and submits its trials; these commands start it, show it and stop it through the Python API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from tfcluster.cli.common import CoordinatorOpt, TlsDirOpt, app, ask, fail

sweep_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Sweeps: one spec run as many trials, each with its own parameters.")
app.add_typer(sweep_app, name="sweep")


@sweep_app.command("start")
def start(
    spec_file: Path = typer.Argument(..., metavar="SPEC.toml", help="A job spec with a [sweep] table."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Start a sweep. Prints the sweep id alone on stdout."""
    from tfcluster.cluster import sweep_spec
    from tfcluster.errors import ClusterError

    try:
        spec = sweep_spec(spec_file)  # a bad spec fails before anything is sent
    except ClusterError as e:
        fail(str(e), e.exit_code)
    print(ask(coordinator, tls_dir, lambda cluster: cluster.sweep(spec).id))


@sweep_app.command("status")
def status(
    sweep_id: str = typer.Argument(..., metavar="ID"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object, its trials best first."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Show a sweep: each trial's job, parameters, state and best value of the metric, best first."""
    from tfcluster.cluster import Sweep

    found = ask(coordinator, tls_dir, lambda cluster: Sweep(cluster, sweep_id).status())
    ranked = found.ranked()
    if as_json:
        from tfcluster import views

        print(json.dumps(views.sweep_doc(found.wire, [t.index for t in ranked]), indent=2))
        return
    from tfcluster.columns import table

    metric = found.sweep.metric
    names = [p.name for p in found.sweep.parameters]
    rows = [[t.job_id or "-", *(t.parameters[n] for n in names), t.state or "waiting",
             "-" if t.best is None else f"{t.best:.6g}", "-" if t.best is None else str(t.best_step),
             "stopped early" if t.stopped_early else ""] for t in ranked]
    title = f"sweep {found.id}: {found.state}" + (f" ({found.message})" if found.message else "") + \
        f"; {found.sweep.method}, {len(found.trials)} trials, {found.sweep.max_concurrent} at once; " \
        f"{metric}: {found.sweep.goal}"
    print(table(("job", *names, "state", f"best {metric}", "step", ""), rows, title))


@sweep_app.command("stop")
def stop(
    sweep_id: str = typer.Argument(..., metavar="ID"),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Stop a sweep: no more trials start, and its running trials are stopped."""
    from tfcluster.cluster import Sweep

    state = ask(coordinator, tls_dir, lambda cluster: Sweep(cluster, sweep_id).stop(wait=False))
    print(f"sweep {sweep_id}: {state}; its running trials are stopping")
