"""Sweeps in the cluster: starting one, stopping one, and the pass that carries out what
core/scheduling/sweeps.py decides for each running sweep (called on every tick). Each trial is submitted as any
job of the sweep's owner is (their class, quota and accounting), with a request id of its own, so a trial
submitted just before a failover is found again rather than submitted twice.
"""

from __future__ import annotations

import logging

from tfcluster.commands import Command
from tfcluster.daemon.coordinator.core.model.changelog import SweepAdded
from tfcluster.daemon.coordinator.core.model.job import Job
from tfcluster.daemon.coordinator.core.model.sweep import Sweep, Sweeps
from tfcluster.daemon.coordinator.core.scheduling import sweeps as rules
from tfcluster.daemon.logformat import fields
from tfcluster.spec import JobSpec
from tfcluster.states import SweepState
from tfcluster.sweepspec import SweepSpec, expand, trial_spec

log = logging.getLogger("tfcluster.coordinator")


class SweepEvents:
    """The sweep half of the cluster (core/cluster.py's Cluster): it submits and stops jobs through the cluster's
    own submit and stop."""
    sweeps: Sweeps
    refusals: tuple[type[Exception], ...]  # what submit raises for a job it refuses

    def add_sweep(self, sweep: Sweep) -> None:
        """A sweep from the store, or just started."""
        self.sweeps.by_id[sweep.id] = sweep
        self.changes.append(SweepAdded(sweep))

    def start_sweep(self, spec: JobSpec, sweep_spec: SweepSpec, now: float, request_id: str = "", owner: str = "",
                    groups: tuple[str, ...] = ()) -> tuple[Sweep, list[Command]]:
        """Starts a sweep and submits its first trials. Raises as submit does when its first trial could never
        be placed, or its class is refused (nothing is kept then). A start retried with the same request id gets
        the sweep of the first."""
        earlier = self.sweeps.by_request(request_id)
        if earlier is not None:
            return earlier, []
        number = self.sweeps.next_number()
        tag = self.jobs.cluster_tag
        sweep = Sweep(id=f"{spec.name}-sweep{number}-{tag}" if tag else f"{spec.name}-sweep{number}", spec=spec,
                      sweep=sweep_spec, parameters=tuple(expand(sweep_spec)), number=number, owner=owner,
                      groups=groups, request_id=request_id, created=now)
        first, commands = self._submit_trial(sweep, 0, now)  # the same refusals as a job's, before anything is kept
        self.add_sweep(sweep)
        sweep.jobs = (first.id,)
        return sweep, commands + self._advance(sweep, now)

    def stop_sweep(self, sweep_id: str, now: float) -> list[Command]:
        """No more trials are submitted, and the live ones are stopped."""
        sweep = self.sweeps.by_id[sweep_id]
        commands: list[Command] = []
        if not sweep.state.ended:
            sweep.state, sweep.finished, sweep.message = SweepState.STOPPED, now, "stopped by user"
        for job_id in sweep.jobs:
            job = self.jobs.get(job_id)
            if job is not None and not job.ended:
                commands += self.stop(job_id, now)
        return commands

    def advance_sweeps(self, now: float) -> list[Command]:
        commands: list[Command] = []
        for sweep in self.sweeps.by_id.values():
            if sweep.state == SweepState.RUNNING:
                try:
                    commands += self._advance(sweep, now)
                except Exception:  # a bug in one sweep must not stop the others, nor the tick
                    log.exception("%s: its pass failed", sweep, extra=fields(job=sweep.id))
        return commands

    def trials_of(self, sweep: Sweep) -> list[rules.Trial]:
        """Each trial as the rules see it (a trial whose job retention forgot counts as ended, with no results)."""
        trials = []
        for index in range(len(sweep.parameters)):
            job_id = sweep.jobs[index] if index < len(sweep.jobs) else ""
            job = self.jobs.get(job_id) if job_id else None
            trials.append(rules.Trial(index=index, job_id=job_id, live=job is not None and not job.ended,
                                      stopped=job_id in sweep.stopped_early,
                                      evaluations=metric_values(job, sweep.sweep.metric) if job else ()))
        return trials

    def trial_rows(self, sweep: Sweep) -> list[dict[str, object]]:
        """Each trial as its status shows it (wire.sweep_status's SweepTrial fields)."""
        rows = []
        for trial in self.trials_of(sweep):
            job = self.jobs.get(trial.job_id) if trial.job_id else None
            row: dict[str, object] = {"index": trial.index, "job_id": trial.job_id, "stopped_early": trial.stopped,
                                      "parameters": sweep.parameters[trial.index],
                                      "state": job.state.value if job else "", "message": job.message if job else ""}
            found = rules.best(sweep.sweep, trial)
            if found is not None:
                row["best"], row["best_step"] = found
            rows.append(row)
        return rows

    def _advance(self, sweep: Sweep, now: float) -> list[Command]:
        decision = rules.decide(sweep.sweep, self.trials_of(sweep))
        commands: list[Command] = []
        for job_id, why in zip(decision.stop, decision.why):
            commands += self.stop(job_id, now)
            self.jobs[job_id].message = why
            sweep.stopped_early = (*sweep.stopped_early, job_id)
        for index in decision.submit:
            try:
                job, submitted = self._submit_trial(sweep, index, now)
            except self.refusals as e:  # the policy or the nodes changed since the start
                sweep.state, sweep.finished, sweep.message = SweepState.FAILED, now, f"trial {index}: {e}"
                log.warning("%s failed: trial %d cannot be submitted: %s", sweep, index, e, extra=fields(job=sweep.id))
                return commands
            sweep.jobs = (*sweep.jobs, job.id)
            commands += submitted
        if decision.finished:
            sweep.state, sweep.finished = SweepState.SUCCEEDED, now
        return commands

    def _submit_trial(self, sweep: Sweep, index: int, now: float) -> tuple[Job, list[Command]]:
        parameters = sweep.parameters[index]
        job, commands = self.submit(trial_spec(sweep.spec, parameters), now, sweep.trial_request_id(index),
                                    owner=sweep.owner, groups=sweep.groups)
        job.sweep, job.sweep_parameters = sweep.id, dict(parameters)
        return job, commands


def metric_values(job: Job, metric: str) -> tuple[tuple[int, float], ...]:
    """(step, value) of each of the job's evaluations that reported the metric."""
    return tuple((e.step, e.metrics[metric]) for e in job.evaluations if metric in e.metrics)
