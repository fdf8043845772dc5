"""Copies of a job's whole host-local checkpoint dir to other nodes (SyncCheckpoints): a restarted group's
new nodes start from the chief's newest checkpoint.

Each copy runs once per sync id. Its answer is kept and sent again when the coordinator asks again, and
after each registration, until the coordinator stops asking (the newest SYNC_RESULTS_KEPT answers are kept).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from tfcluster import wire
from tfcluster.commands import SyncCheckpoints
from tfcluster.daemon.agent.hooks.api import Send, TaskHook
from tfcluster.daemon.agent.hooks.shipping import ShipError, job_checkpoint_dir, peers, sync_dir
from tfcluster.daemon.logformat import fields
from tfcluster.model import SyncResult
from tfcluster.security import Credentials

log = logging.getLogger("tfcluster.agent")

SYNC_RESULTS_KEPT = 100


class CopiesHook(TaskHook):
    commands = (SyncCheckpoints,)

    def __init__(self, state_dir: Path, send: Send, credentials: Callable[[], Credentials], metrics):
        self.state_dir = state_dir
        self.send = send
        self.credentials = credentials
        self.metrics = metrics  # the agent's (metrics.py)
        self.results: dict[tuple[str, int], SyncResult] = {}  # (job, sync id): kept until the coordinator stops asking
        self.running: set[tuple[str, int]] = set()
        self.lock = threading.Lock()

    def on_register(self) -> None:
        with self.lock:
            for result in self.results.values():
                self.send(wire.sync_result_to_proto(result))

    def jobs_in_use(self) -> set[str]:
        with self.lock:
            return {job_id for job_id, _ in self.running}

    def handle(self, order: SyncCheckpoints) -> None:
        """Starts the copy, once per sync id: asked again, the kept answer is sent again."""
        key = (order.job_id, order.sync_id)
        with self.lock:
            if key in self.results:
                self.send(wire.sync_result_to_proto(self.results[key]))
                return
            if key in self.running:
                return
            self.running.add(key)
        threading.Thread(target=self._copy, args=(order,), name="sync", daemon=True).start()

    def _copy(self, order: SyncCheckpoints) -> None:
        directory = job_checkpoint_dir(self.state_dir, order.job_id)
        total, seconds, errors = 0, 0.0, []
        for target in peers(order.targets, order.target_nodes):
            try:
                size, took = sync_dir(target, order.job_id, str(directory), self.credentials()) \
                    if directory.is_dir() else (0, 0.0)
                total, seconds = total + size, seconds + took
                self.metrics.shipped("copy", size, took)
            except (OSError, ShipError) as e:
                errors.append(str(e))
                self.metrics.ship_failed("copy")
        log.info("%s: copied checkpoints to %s: %.1f MB in %.2f s%s", order.job_id, ", ".join(order.targets),
                 total / 1e6, seconds, f"; failed: {'; '.join(errors)}" if errors else "",
                 extra=fields(job=order.job_id))
        result = SyncResult(order.job_id, order.sync_id, ok=not errors, message="; ".join(errors), bytes=total,
                            seconds=seconds)
        with self.lock:
            self.running.discard((order.job_id, order.sync_id))
            self.results[(order.job_id, order.sync_id)] = result
            while len(self.results) > SYNC_RESULTS_KEPT:
                del self.results[next(iter(self.results))]
        self.send(wire.sync_result_to_proto(result))
