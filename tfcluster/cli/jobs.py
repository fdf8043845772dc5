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
from tfcluster.cli.common import FLAG_FOR_KEY, MAX_INT32, CoordinatorOpt, TlsDirOpt, app, connect, err, fail, out
from tfcluster.client import Client, ClientError
from tfcluster.model import CHIEF, ROLE_TYPES, WORKER
from tfcluster.states import ENDED_JOB_STATES, JobState, TaskState

# A job's spec (parsing, checking) and its conversions to the wire are imported by the commands that send one
# (start, plan): `tfcluster status` starts without them.

def _load_spec(spec_file: Path):
    from tfcluster.spec import SpecError
    from tfcluster.specfile import load_spec_file

    try:
        return load_spec_file(spec_file)
    except SpecError as e:
        fail(str(e), 2)


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
    with connect(coordinator, tls_dir) as client:
        if not spec.shared_workdir:
            from tfcluster.cli.code import ship_code

            spec = ship_code(client, spec)
        try:
            job_id = client.submit(spec)
        except ClientError as e:
            fail(str(e), e.exit_code)
        print(job_id, flush=True)
        if not (wait or follow):
            print(f"job {job_id} submitted; watch it with: tfcluster status {job_id}", file=sys.stderr, flush=True)
            return
        raise typer.Exit(_wait_for(client, job_id, follow))


def _wait_for(client: Client, job_id: str, follow: bool) -> int:
    if follow:
        _follow_primary(client, job_id)
    last = None
    for job in _views(client, job_id):
        if job.state != last:
            err.print(f"{job_id}: {job.state}" + (f" ({job.message})" if job.message else ""), markup=False)
            last = job.state
    return 0 if last == JobState.SUCCEEDED else 1


def _views(client: Client, job_id: str):
    """The job's status at each change (streamed by the coordinator), until it has ended; a lost connection is
    said in one line and the watch taken up again."""
    while True:
        try:
            for job in client.watch(job_id, ENDED_JOB_STATES):
                yield job
                if job.state in ENDED_JOB_STATES:
                    return
        except ClientError as e:
            err.print(f"warning: {e}; retrying", markup=False)
            time.sleep(2)


def _follow_primary(client: Client, job_id: str) -> None:
    """Streams the chief's (or worker 0's) log, attempt after attempt, until the job ends."""
    attempt_seen = 0
    for job in _views(client, job_id):
        primary = next((t for t in job.tasks if t.type == CHIEF), None) or \
            next((t for t in job.tasks if t.type == WORKER and t.index == 0), None)
        if primary is None or primary.attempt <= attempt_seen or primary.state == TaskState.PENDING:
            continue  # the job's next change may start it (a job that ended ends the views)
        attempt_seen = primary.attempt
        try:
            for data in client.logs(job_id, primary.type, primary.index, follow=True, attempt=primary.attempt):
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
        except ClientError as e:
            err.print(f"warning: log stream ended: {e}", markup=False)
            time.sleep(1)


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
    with connect(coordinator, tls_dir) as client:
        try:
            result = client.plan(spec)
        except ClientError as e:
            fail(str(e), e.exit_code)
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

    with connect(coordinator, tls_dir) as client:
        def fetch():
            try:
                return client.view(job_id, show_all, node, states)
            except ClientError as e:
                fail(str(e), e.exit_code)
        if as_json:
            from tfcluster import views

            nodes, jobs, summary = fetch()
            doc = views.status_doc(nodes, jobs, summary)
            if summary is not None:
                doc["summary"]["dashboard"] = _dashboard(client, summary)
            print(json.dumps(doc, indent=2))
            return
        if not watch:
            view = fetch()
            print(render_status(*view, job_id=job_id, colour_on=colour_wanted()))
            if view[2] is not None and view[2].dashboard_port:
                print(f"dashboard: {_dashboard(client, view[2])}  (a browser logs in with `tfcluster "
                      f"dashboard{' ' + job_id if job_id else ''}`)")
            return
        from rich.live import Live

        with Live(rich_status(*fetch(), job_id=job_id), console=out.console, refresh_per_second=4) as live:
            try:
                while True:
                    time.sleep(1.0)
                    view = fetch()
                    live.update(rich_status(*view, job_id=job_id))
                    if job_id and view[1] and view[1][0].state in ENDED_JOB_STATES:
                        break
            except KeyboardInterrupt:
                pass


def _dashboard(client: Client, summary) -> str:
    return client.dashboard_url(summary.dashboard_port, summary.insecure) if summary.dashboard_port else ""


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
    with connect(coordinator, tls_dir) as client:
        try:
            state = client.stop(job_id, graceful)
            while wait and state not in ENDED_JOB_STATES:
                time.sleep(0.3)
                state = client.status(job_id).jobs[0].state
        except ClientError as e:
            fail(str(e), e.exit_code)
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
    task_type, sep, index = task.partition(":")
    if task == "env":
        if not node:
            fail("logs JOB env: --node NAME says which node's environment build to show", 2)
        task_type, index = "", "0"
    elif not sep or not index.isdigit() or int(index) > MAX_INT32 or task_type not in ROLE_TYPES:
        fail(f"expected TYPE:INDEX with TYPE one of chief, worker, ps, evaluator (e.g. worker:1), or env, got {task!r}",
             2)
    elif node:
        fail("--node goes with `env`: a task's log comes from the node it runs on", 2)
    with connect(coordinator, tls_dir) as client:
        try:
            for data in client.logs(job_id, task_type, int(index), follow=follow, tail_lines=tail, attempt=attempt,
                                    environment_node=node or ""):
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
        except ClientError as e:
            fail(str(e), e.exit_code)
        except KeyboardInterrupt:
            pass
        except BrokenPipeError:  # `tfcluster logs ... | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
