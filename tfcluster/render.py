"""The coordinator's answers as plain text: `tfcluster status`, `usage` and `plan`, and the demo's views.

Each function returns a string; `colour_on` adds ANSI colours (columns.py says when a terminal wants them).
"""

from __future__ import annotations

import time
from typing import Optional

from tfcluster.conditions import EXCLUDING
from tfcluster.columns import Painted, paint, table
from tfcluster.model import exit_words
from tfcluster.states import JobState, NodeState, TaskState


def gpu_list(gpus) -> str:
    return ",".join(str(g.index) for g in gpus)


def _ago(seconds: float) -> str:
    return f"{seconds:.1f}s ago"


def how_long(seconds: float) -> str:
    """A wait or an age as people read it: 45s, 12m, 3h 5m, 2d 4h."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def render_summary(summary, colour_on: bool = False) -> str:
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
    if summary.insecure:
        line += "\n" + paint("WARNING: the coordinator runs without TLS (--insecure): anyone who reaches it controls "
                             "the cluster", "bold red", colour_on)
    return line


def _node_state(n) -> Painted:
    if n.state != NodeState.READY:
        return Painted(n.state, "red")
    if n.HasField("drain"):  # Slurm's words: DRAINING while jobs placed before still run, then DRAINED
        return Painted(f"{n.drain.state or 'DRAINED'}*", "yellow")
    return Painted(f"{n.state}*", "yellow") if n.condition else Painted(n.state, "green")


def _node_note(n, now: float) -> str:
    """The footnote of a node marked *: why it takes no new tasks."""
    if n.HasField("drain"):
        d = n.drain
        return f"* {n.name} drained by {d.by or 'an admin'} {how_long(now - d.since)} ago: {d.reason}"
    return f"* {n.name} takes no new tasks: {n.condition}"


LABELS_SHOWN = 4  # labels in a node's cell of the status table


def _gpus_cell(n) -> str:
    """Its GPUs, each one its agent found a problem on marked ! (the footnotes say what)."""
    marked = {c.gpu for c in n.conditions if c.HasField("gpu")}
    return ", ".join(f"{g.index}:{g.name or 'gpu'}{'!' if g.index in marked else ''}" for g in n.gpus) or "-"


def _labels_cell(n) -> str:
    """Its labels, the first few when there are many (`status --json` has them all)."""
    shown = ",".join(n.labels[:LABELS_SHOWN])
    return (shown + f" +{len(n.labels) - LABELS_SHOWN}" if len(n.labels) > LABELS_SHOWN else shown) or "-"


def _nodes_table(nodes_shown, colour_on: bool) -> list[str]:
    labelled = any(n.labels for n in nodes_shown)  # a cluster without labels keeps its table as it was
    rows = []
    for n in nodes_shown:
        memory = f"{n.memory_bytes / 2**30:.1f} GiB"
        if n.memory_allocated_bytes:  # what tasks' limits hold of it
            memory = f"{n.memory_allocated_bytes / 2**30:.1f} of {memory}"
        rows.append([n.name, n.address, _node_state(n), *([_labels_cell(n)] if labelled else []),
                     _gpus_cell(n), str(n.cpu_count), memory,
                     str(n.running_tasks), n.agent_version, _ago(n.last_seen_seconds_ago)])
    headers = ("node", "address", "state", *(("labels",) if labelled else ()), "GPUs", "CPUs", "memory", "tasks",
               "agent", "heartbeat")
    now = time.time()
    return [table(headers, rows, "nodes", colour_on),
            *(paint(_node_note(n, now), "yellow", colour_on)
              for n in nodes_shown if n.condition or n.HasField("drain")),
            *(paint(_condition_note(n.name, c, now), "red" if c.kind in EXCLUDING else "yellow", colour_on)
              for n in nodes_shown for c in n.conditions)]


def _condition_note(node: str, c, now: float) -> str:
    """The footnote of a GPU marked !: what its agent found, and whether placement leaves it out."""
    where = f"GPU {c.gpu}" if c.HasField("gpu") else "node"
    excluded = c.HasField("gpu") and c.kind in EXCLUDING
    return (f"! {node} {where}: {c.message} ({c.kind}, for {how_long(now - c.since)}; "
            f"{'left out of placement' if excluded else 'still placed on'})")


def _jobs_table(jobs_shown, colour_on: bool) -> str:
    rows = []
    for j in jobs_shown:
        counts: dict[str, int] = {}
        for t in j.tasks:
            counts[t.state] = counts.get(t.state, 0) + 1
        tasks = ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items()))
        restarts = f"{j.restarts} (+{j.preemptions} preempted)" if j.preemptions else str(j.restarts)
        rows.append([j.id, j.owner or "-", j.strategy, _state(j.state), restarts, tasks, j.message or ""])
    if not rows:
        return "jobs: none"
    return table(("job", "owner", "strategy", "state", "restarts", "tasks", "message"), rows, "jobs", colour_on)


def _job_details(job, colour_on: bool) -> list[str]:
    rows = []
    for t in job.tasks:
        exit_text = exit_words(t.exit_code if t.HasField("exit_code") else None,
                               t.signal if t.HasField("signal") else None)
        rows.append([f"{t.type}:{t.index}", t.node or "-", t.address or "-", gpu_list(t.gpus) or "-",
                     _state(t.state), str(t.pid or ""), exit_text, str(t.attempt), t.message])
    parts = [table(("task", "node", "address", "GPUs", "state", "pid", "exit", "attempt", "message"), rows,
                   f"tasks of {job.id}", colour_on), usage_line(job)]
    if job.HasField("last_failure"):
        f = job.last_failure
        tail = "\n".join(f"    {line}" for line in f.log_tail[-8:])
        parts.append(f"last failure: {f.description}" + (f"\n  last lines:\n{tail}" if tail else ""))
    if job.HasField("last_evaluation"):
        e = job.last_evaluation
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(e.metrics.items()))
        parts.append(f"latest evaluation: step {e.step} ({e.checkpoint}): {metrics}")
    return parts


def render_status(nodes_shown, jobs_shown, summary=None, job_id: Optional[str] = None, colour_on: bool = False) -> str:
    """The summary, the nodes and the jobs; with job_id, that job's tasks, usage, last failure and evaluation."""
    parts = [render_summary(summary, colour_on)] if summary is not None else []
    if nodes_shown or not job_id:
        parts.append("\n".join(_nodes_table(nodes_shown, colour_on)))
    parts.append(_jobs_table(jobs_shown, colour_on))
    if job_id and jobs_shown:
        parts += _job_details(jobs_shown[0], colour_on)
    return "\n\n".join(parts)


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


def render_usage(report) -> str:
    """`tfcluster usage`: one table per user, one per group, most GPU-hours first."""
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(report.since))
    until = time.strftime("%Y-%m-%d %H:%M", time.localtime(report.until))
    parts = [f"usage from {since} to {until} (the coordinator keeps {report.horizon_seconds / 86400:g} days)"]
    for title, rows in (("users", report.users), ("groups", report.groups)):
        lines = [[t.name or "(no owner)", f"{t.gpu_seconds / 3600:.2f}", f"{t.cpu_seconds / 3600:.2f}",
                  byte_size(t.peak_rss_bytes) if t.peak_rss_bytes else "-", str(t.jobs)] for t in rows]
        parts.append(table((title[:-1], "GPU-hours", "CPU-hours", "peak memory", "jobs"), lines, title) if rows
                     else f"{title}: none used anything in this window")
    return "\n\n".join(parts)


def render_plan(name: str, plan) -> str:
    rows = [[f"{t.task_type}:{t.task_index}", t.node, t.address, gpu_list(t.gpus) or "-",
             ", ".join(t.env_names) or "-", t.tf_config] for t in plan.tasks]
    return table(("task", "node", "address", "GPUs", "env (values hidden)", "TF_CONFIG"), rows,
                 f"{name}: {plan.strategy}, {len(plan.tasks)} tasks")


# A job's and a task's states share their words (SUCCEEDED, RUNNING, ...), so one colour serves both.
STATE_COLOURS = {JobState.SUCCEEDED: "green", JobState.RUNNING: "cyan", JobState.FAILED: "red",
                 TaskState.LOST: "red", JobState.STOPPED: "yellow", JobState.STOPPING: "yellow",
                 JobState.PENDING: "magenta", JobState.STARTING: "blue", TaskState.LAUNCHING: "blue"}


def _state(state: str) -> Painted:
    """A state as the coordinator sent it, coloured (a state this client does not know is shown plain)."""
    return Painted(state, STATE_COLOURS.get(state, ""))


def rich_status(nodes_shown, jobs_shown, summary=None, job_id: Optional[str] = None):
    """render_status for rich's own views (`status --watch`, the demo): rich reads the colours back from the
    escapes and leaves them out where its console is not a terminal."""
    from rich.text import Text
    return Text.from_ansi(render_status(nodes_shown, jobs_shown, summary, job_id, colour_on=True))
