"""Rich renderings of the coordinator's status, shared by `tfcluster status` and the demo."""

from __future__ import annotations

import time
from typing import Optional

from rich.console import Group
from rich.text import Text
from rich.table import Table

from tfcluster.states import JobState, NodeState, TaskState


def gpu_list(gpus) -> str:
    return ",".join(str(g.index) for g in gpus)


def _ago(seconds: float) -> str:
    return f"{seconds:.1f}s ago"


def render_summary(summary) -> Text:
    """One line for the whole cluster, and what the overview leaves out."""
    ready_first = sorted(summary.nodes_by_state.items(), key=lambda kv: kv[0] != NodeState.READY)
    nodes = ", ".join(f"{v} {k}" for k, v in ready_first)
    jobs = ", ".join(f"{v} {k.lower()}" for k, v in summary.jobs_by_state.items())
    line = f"nodes: {nodes or 'none'}; GPUs: {summary.gpus_allocated} of {summary.gpus_total} allocated; " \
           f"jobs: {jobs or 'none'}"
    total_nodes, total_jobs = sum(summary.nodes_by_state.values()), sum(summary.jobs_by_state.values())
    hidden = []
    if summary.nodes_shown and summary.nodes_shown < total_nodes:
        hidden.append(f"{summary.nodes_shown} of {total_nodes} nodes")
    if summary.jobs_shown < total_jobs:
        hidden.append(f"{summary.jobs_shown} of {total_jobs} jobs (the active ones and the newest ended)")
    if hidden:
        line += (f"\nshowing {' and '.join(hidden)}: `--all` lists everything, `--node NAME` and `--state STATE` "
                 f"narrow it")
    if summary.leader:
        line += f"\nleader: the coordinator at {summary.leader}"
    text = Text(line)
    if summary.insecure:
        text.append("\nWARNING: the coordinator runs without TLS (--insecure): anyone who reaches it controls the "
                    "cluster", style="bold red")
    return text


def render_status(nodes_shown, jobs_shown, summary=None, job_id: Optional[str] = None) -> Group:
    parts = [render_summary(summary)] if summary is not None else []
    nodes = Table(title="nodes", title_justify="left")
    for col in ("node", "address", "state", "GPUs", "CPUs", "memory", "tasks", "agent", "heartbeat"):
        nodes.add_column(col)
    for n in nodes_shown:
        gpu_text = ", ".join(f"{g.index}:{g.name or 'gpu'}" for g in n.gpus) or "-"
        state = f"[red]{n.state}[/]" if n.state != NodeState.READY else f"[yellow]{n.state}*[/]" if n.condition else \
            f"[green]{n.state}[/]"
        memory = f"{n.memory_bytes / 2**30:.1f} GiB"
        if n.memory_allocated_bytes:  # what tasks' limits hold of it
            memory = f"{n.memory_allocated_bytes / 2**30:.1f} of {memory}"
        nodes.add_row(n.name, n.address, state, gpu_text, str(n.cpu_count), memory,
                      str(n.running_tasks), n.agent_version, _ago(n.last_seen_seconds_ago))
    if nodes_shown or not job_id:
        parts.append(nodes)
        parts += [Text(f"* {n.name} takes no new tasks: {n.condition}", style="yellow")
                  for n in nodes_shown if n.condition]
    jobs = Table(title="jobs", title_justify="left")
    for col in ("job", "owner", "strategy", "state", "restarts", "tasks", "message"):
        jobs.add_column(col, overflow="fold")
    for j in jobs_shown:
        counts: dict[str, int] = {}
        for t in j.tasks:
            counts[t.state] = counts.get(t.state, 0) + 1
        summary = ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items()))
        restarts = f"{j.restarts} (+{j.preemptions} preempted)" if j.preemptions else str(j.restarts)
        jobs.add_row(j.id, j.owner or "-", j.strategy, _colour_state(j.state), restarts, summary, j.message or "")
    parts.append(jobs)
    if job_id and jobs_shown:
        job = jobs_shown[0]
        tasks = Table(title=f"tasks of {job.id}", title_justify="left")
        for col in ("task", "node", "address", "GPUs", "state", "pid", "exit", "attempt", "message"):
            tasks.add_column(col, overflow="fold")
        for t in job.tasks:
            exit_text = f"signal {t.signal}" if t.HasField("signal") else \
                (str(t.exit_code) if t.HasField("exit_code") else "")
            tasks.add_row(f"{t.type}:{t.index}", t.node or "-", t.address or "-", gpu_list(t.gpus) or "-",
                          _colour_state(t.state), str(t.pid or ""), exit_text, str(t.attempt), t.message)
        parts.append(tasks)
        parts.append(Text(usage_line(job)))
        if job.HasField("last_failure"):
            f = job.last_failure
            tail = "\n".join(f"    {line}" for line in f.log_tail[-8:])
            parts.append(Text(f"last failure: {f.description}" + (f"\n  last lines:\n{tail}" if tail else "")))
        if job.HasField("last_evaluation"):
            e = job.last_evaluation
            metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(e.metrics.items()))
            parts.append(Text(f"latest evaluation: step {e.step} ({e.checkpoint}): {metrics}"))
    return Group(*parts)


def byte_size(n: int) -> str:
    """Bytes in the largest binary unit that keeps the number at 1 or more: 512 MiB, 16.4 GiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def usage_line(job) -> str:
    """A job's usage in one line, for `tfcluster status JOB`."""
    return f"usage: {job.gpu_seconds / 3600:.2f} GPU-hours, {job.cpu_seconds / 3600:.2f} CPU-hours, " \
           f"peak memory {byte_size(job.peak_rss_bytes) if job.peak_rss_bytes else '-'} (one task)"


def render_usage(report) -> Group:
    """`tfcluster usage`: one table per user, one per group, most GPU-hours first."""
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(report.since))
    until = time.strftime("%Y-%m-%d %H:%M", time.localtime(report.until))
    parts: list = [Text(f"usage from {since} to {until} (the coordinator keeps "
                        f"{report.horizon_seconds / 86400:g} days)")]
    for title, rows in (("users", report.users), ("groups", report.groups)):
        table = Table(title=title, title_justify="left")
        for col in (title[:-1], "GPU-hours", "CPU-hours", "peak memory", "jobs"):
            table.add_column(col, justify="left" if col == title[:-1] else "right")
        for t in rows:
            table.add_row(t.name or "(no owner)", f"{t.gpu_seconds / 3600:.2f}", f"{t.cpu_seconds / 3600:.2f}",
                          byte_size(t.peak_rss_bytes) if t.peak_rss_bytes else "-", str(t.jobs))
        parts.append(table if rows else Text(f"{title}: none used anything in this window"))
    return Group(*parts)


def render_plan(name: str, plan) -> Table:
    table = Table(title=f"{name}: {plan.strategy}, {len(plan.tasks)} tasks")
    for col in ("task", "node", "address", "GPUs", "env (values hidden)", "TF_CONFIG"):
        table.add_column(col, overflow="fold")
    for t in plan.tasks:
        table.add_row(f"{t.task_type}:{t.task_index}", t.node, t.address, gpu_list(t.gpus) or "-",
                      ", ".join(t.env_names) or "-", t.tf_config)
    return table


# A job's and a task's states share their words (SUCCEEDED, RUNNING, ...), so one colour serves both.
STATE_COLOURS = {JobState.SUCCEEDED: "green", JobState.RUNNING: "cyan", JobState.FAILED: "red",
                 TaskState.LOST: "red", JobState.STOPPED: "yellow", JobState.STOPPING: "yellow",
                 JobState.PENDING: "magenta", JobState.STARTING: "blue", TaskState.LAUNCHING: "blue"}


def _colour_state(state: str) -> str:
    """A state as the coordinator sent it, coloured (a state this client does not know is shown plain)."""
    colour = STATE_COLOURS.get(state)
    return f"[{colour}]{state}[/]" if colour else state
