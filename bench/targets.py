"""The ratio targets of `make bench`, in one place: bench/guard.py, run last, fails the bench when a ratio written
in this run is past its target. docs/benchmarks.md states each target where its bench is described.

A target names a bench's JSON file and a key; every value under that key, at any depth of the file (one per
fleet size, say), is held to the target.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    file: str    # the bench's JSON, in bench/
    key: str     # a ratio the bench writes there: measured / its floor, measured in the same run
    most: float  # the largest the ratio may be
    what: str    # what the ratio compares, for the guard's message


TARGETS = (
    Target("heartbeat_profile.json", "coordinator_vs_plain_floor", 1.3,
           "the coordinator's CPU per heartbeat over plain TCP / the bare server's (plain floor)"),
    Target("heartbeat_profile.json", "coordinator_vs_tls_floor", 1.1,
           "the coordinator's CPU per heartbeat over mutual TLS / the bare server's (TLS floor)"),
    Target("queue_burst.json", "burst_vs_one_at_a_time", 5.0,
           "the core's CPU per tiny job with hundreds waiting / the same jobs one at a time (no queue)"),
    Target("queue_burst.json", "burst_writes_vs_one_at_a_time", 1.5,
           "the job records written per tiny job with hundreds waiting / the same jobs one at a time (no queue)"),
    Target("queue_burst.json", "tick_with_queue_vs_none", 20.0,
           "the coordinator's tick with 10,000 jobs waiting in the queue / the same cluster's tick with none waiting"),
    Target("cli.json", "throughput_cpu_vs_floor", 16.0,
           "the CPU per tiny job (2 tasks of `true`), every process's, / the same two processes forked by a bare loop"),
    Target("standby_down.json", "leader_down_vs_up", 1.3,
           "the leader's cores with its only standby down / with it up, every agent heartbeating"),
    Target("usage_ledger.json", "folded_vs_one_per_job_bytes", 0.25,
           "the usage ledger's bytes after 500,000 short jobs, short jobs folded into hours / one entry per job"),
    Target("queue_burst.json", "quota_burst_vs_burst", 2.0,
           "the core's CPU per tiny job in that burst under a GPU-hour quota, 100,000 ended jobs in its window / "
           "the same burst without a policy"),
)
