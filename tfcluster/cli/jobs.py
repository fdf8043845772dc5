"""The job commands: start, plan, status, stop, logs."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from tfcluster import strategies
from tfcluster.cli.common import FLAG_FOR_KEY, MAX_INT32, CoordinatorOpt, TlsDirOpt, app, ask, connect, err, fail, out
from tfcluster.cluster import Job, job_spec
from tfcluster.errors import ClusterError
from tfcluster.states import ENDED_JOB_STATES, JobState

# A job's spec (parsing, checking) and its conversions to the wire are imported by the commands that send one
# (start, plan): `tfcluster status` starts without them.

def _load_spec(spec_file: Path):
    try:
        return job_spec(spec_file)
    except ClusterError as e:
        fail(str(e), e.exit_code)


def _warn(message: str) -> None:
    err.print(message, markup=False)


@app.command()
def start(
    args: list[str] = typer.Argument(None, metavar="[SPEC.toml | -- COMMAND ...]",
                                     help="A job spec file, or (with --name and --strategy) the command after --."),
    name: Optional[str] = typer.Option(None, help="Job name (with flags instead of a spec file)."),
    strategy: Optional[str] = typer.Option(None, help=f"One of: {', '.join(strategies.NAMES)}."),
    workers: Optional[int] = typer.Option(None, min=0, help="Number of workers [default: 1]."),
    chief: bool = typer.Option(False, "--chief", help="Add a chief task."),
    ps: Optional[int] = typer.Option(None, min=0, help="Number of parameter servers."),
    evaluator: bool = typer.Option(False, "--evaluator", help="Add an evaluator task."),
    gpus_per_task: Optional[int] = typer.Option(None, min=0, help="GPUs per training task [default: 0]."),
    checkpoint_dir: Optional[str] = typer.Option(None, help="Shared checkpoint dir (host-local when absent)."),
    env: list[str] = typer.Option([], "--env", "-e", metavar="NAME=VALUE", help="Environment for every task."),
    max_restarts: Optional[int] = typer.Option(None, min=0, help="Restart budget of the job [default: 3]."),
    memory: Optional[str] = typer.Option(None, metavar="SIZE",
                                         help="Memory each task may use, such as 16G [default: not limited]."),
    wait: bool = typer.Option(False, "--wait", help="Wait for the job to end; exit 0 only if it SUCCEEDED."),
    follow: bool = typer.Option(False, "--follow", help="Stream the chief's (or worker 0's) log; implies --wait."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Submit a job. Prints the job id alone on stdout."""
    from tfcluster.spec import SpecError
    from tfcluster.specfile import parse_spec, resolve_paths, spec_from_flags

    args = args or []
    if name is None and strategy is None:
        if len(args) != 1:
            fail("expected a spec file (tfcluster start job.toml), or --name, --strategy and a command after --", 2)
        given = {"--workers": workers is not None, "--chief": chief, "--ps": ps is not None,
                 "--evaluator": evaluator, "--gpus-per-task": gpus_per_task is not None,
                 "--checkpoint-dir": checkpoint_dir is not None, "--env": bool(env),
                 "--max-restarts": max_restarts is not None, "--memory": memory is not None}
        clashing = [flag for flag, present in given.items() if present]
        if clashing:
            fail(f"{clashing[0]} describes the job and cannot be combined with a spec file; set it in {args[0]}", 2)
        spec = _load_spec(Path(args[0]))
    else:
        if name is None or strategy is None:
            fail("--name and --strategy go together (or give a spec file instead)", 2)
        env_table = {}
        for item in env:
            key, sep, value = item.partition("=")
            if not sep:
                fail(f"--env: expected NAME=VALUE, got {item!r}", 2)
            env_table[key] = value
        data = spec_from_flags(name=name, strategy=strategy, workers=1 if workers is None else workers, chief=chief,
                               ps=ps or 0, evaluator=evaluator, gpus_per_task=gpus_per_task or 0,
                               checkpoint_dir=checkpoint_dir,
                               command=args, env=env_table, max_restarts=max_restarts, memory=memory)
        try:
            spec = resolve_paths(parse_spec(data, source="flags"), Path.cwd())
        except SpecError as e:
            fail(str(SpecError("flags", FLAG_FOR_KEY.get(e.key, e.key), e.message)), 2)
    with connect(coordinator, tls_dir) as cluster:
        try:
            job = cluster.start(spec)
        except ClusterError as e:
            fail(str(e), e.exit_code)
        print(job.id, flush=True)
        if not (wait or follow):
            print(f"job {job.id} submitted; watch it with: tfcluster status {job.id}", file=sys.stderr, flush=True)
            return
        raise typer.Exit(_wait_for(job, follow))


def _wait_for(job: Job, follow: bool) -> int:
    """Waits for the job to end, saying each state it passes through; with follow, the chief's (or worker 0's)
    log first, on stdout."""
    try:
        if follow:
            for data in job.follow_primary(on_retry=_warn):
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
        ended = job.wait(on_change=lambda j: _warn(f"{job.id}: {j.state}" + (f" ({j.message})" if j.message else "")),
                         on_retry=lambda e: _warn(f"warning: {e}; retrying"))
    except ClusterError as e:
        fail(str(e), e.exit_code)
    return 0 if ended.state == JobState.SUCCEEDED else 1


@app.command()
def plan(
    spec_file: Path = typer.Argument(..., metavar="SPEC.toml"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Show where a job's tasks would go and every TF_CONFIG; launches nothing."""
    from tfcluster import views
    from tfcluster.render import render_plan

    spec = _load_spec(spec_file)
    result = ask(coordinator, tls_dir, lambda cluster: cluster.plan(spec).wire)
    if as_json:
        print(json.dumps(views.plan_doc(result), indent=2))
    elif not result.fits:
        err.print(f"{spec.name} does not fit now: {result.reason}", markup=False)
    else:
        print(render_plan(spec.name, result))
    if not result.fits:
        raise typer.Exit(1)


@app.command()
def status(
    job_id: Optional[str] = typer.Argument(None, metavar="[JOB]"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: {\"nodes\": [...], \"jobs\": [...]}."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh every second until interrupted."),
    show_all: bool = typer.Option(False, "--all", "-a", help="Every node and every job, page by page."),
    node: Optional[str] = typer.Option(None, "--node", metavar="NAME", help="This node and the jobs with tasks on it."),
    state: list[str] = typer.Option([], "--state", metavar="STATE",
                                    help="Only jobs in this state (repeatable): " + ", ".join(JobState) + "."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Show the cluster: a summary, nodes and jobs (a bounded overview unless --all); with JOB, its tasks."""
    states = [s.upper() for s in state]
    unknown = [s for s in states if s not in JobState.__members__]
    if unknown:
        fail(f"--state: expected one of {', '.join(JobState)}, got {unknown[0]!r}", 2)
    if job_id and (show_all or node or states):
        fail("JOB shows one job: --all, --node and --state choose among jobs, so they go without it", 2)
    from tfcluster.columns import colour_wanted
    from tfcluster.render import render_status, rich_status

    with connect(coordinator, tls_dir) as cluster:
        def fetch():
            try:
                return cluster.status(job_id, show_all, node, tuple(states))
            except ClusterError as e:
                fail(str(e), e.exit_code)
        if as_json:
            from tfcluster import views

            view = fetch()
            doc = views.status_doc(*_wire(view))
            if view.summary is not None:
                doc["summary"]["dashboard"] = cluster.dashboard_address(view.summary)
            print(json.dumps(doc, indent=2))
            return
        if not watch:
            view = fetch()
            print(render_status(*_wire(view), job_id=job_id, colour_on=colour_wanted()))
            if view.summary is not None and view.summary.dashboard_port:
                print(f"dashboard: {cluster.dashboard_address(view.summary)}  (a browser logs in with `tfcluster "
                      f"dashboard{' ' + job_id if job_id else ''}`)")
            return
        from rich.live import Live

        with Live(rich_status(*_wire(fetch()), job_id=job_id), console=out.console, refresh_per_second=4) as live:
            try:
                while True:
                    time.sleep(1.0)
                    view = fetch()
                    live.update(rich_status(*_wire(view), job_id=job_id))
                    if job_id and view.jobs and view.jobs[0].state in ENDED_JOB_STATES:
                        break
            except KeyboardInterrupt:
                pass


def _wire(view) -> tuple[list, list, object]:
    """The messages a status was read from, as render.py and views.py draw them (for the dashboard alike)."""
    return ([n.wire for n in view.nodes], [j.wire for j in view.jobs],
            view.summary.wire if view.summary is not None else None)


@app.command()
def stop(
    job_id: str = typer.Argument(..., metavar="JOB"),
    graceful: bool = typer.Option(True, "--graceful/--now",
                                  help="SIGTERM and the job's grace period before SIGKILL (default), or SIGKILL at once."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until every task has exited."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Stop a job: SIGTERM to every task's process group, SIGKILL after the grace period."""
    state = ask(coordinator, tls_dir, lambda cluster: cluster.job(job_id).stop(graceful, wait))
    err.print(f"{job_id}: {state}")


@app.command()
def logs(
    job_id: str = typer.Argument(..., metavar="JOB"),
    task: str = typer.Argument(..., metavar="TYPE:INDEX|env",
                               help="For example worker:1 or chief:0; `env`: the build of the job's environment."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the task ends."),
    tail: int = typer.Option(0, "--tail", "-n", min=0, max=MAX_INT32, help="Only the last N lines."),
    attempt: int = typer.Option(0, min=0, max=MAX_INT32, help="An earlier attempt's log [default: the current one]."),
    node: Optional[str] = typer.Option(None, "--node", metavar="NAME",
                                       help="With `env`: the node whose build of the job's environment to show."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Print a task's log, exactly as the task wrote it, from whichever node it runs on. Past the agent's
    --max-task-log, the log's start and its newest part are kept, with one line saying how much was dropped.
    `tfcluster logs JOB env --node NAME` prints how that node built the job's environment."""
    with connect(coordinator, tls_dir) as cluster:
        try:
            for data in cluster.job(job_id).logs(task, follow=follow, tail=tail, attempt=attempt, node=node or ""):
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
        except ClusterError as e:
            fail(str(e), e.exit_code)
        except KeyboardInterrupt:
            pass
        except BrokenPipeError:  # `tfcluster logs ... | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
