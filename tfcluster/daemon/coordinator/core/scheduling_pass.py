"""One scheduling pass over the cluster (Cluster.schedule): tasks that lost their node first, then jobs that
preempted others once what they freed is there, then the PENDING jobs that fit now in queue order (queue.py);
those that wait for resources may preempt jobs of lower classes (preemption.py). Pure, like the cluster: the
time is passed in and the commands are returned.

A pass works on a copy of the nodes' free capacity: what it places is taken out of it at once, so the next job
in the pass sees what is left.
"""

from __future__ import annotations

import logging
from typing import Protocol

from tfcluster.commands import Command
from tfcluster.daemon.coordinator.core.lifecycle import back_to_queue
from tfcluster.daemon.coordinator.core.lifecycle import transitions as lifecycle
from tfcluster.daemon.coordinator.core.model.job import Job
from tfcluster.daemon.coordinator.core.model.job_table import Jobs
from tfcluster.daemon.coordinator.core.model.node_table import Nodes
from tfcluster.daemon.coordinator.core.model.observer import Observer
from tfcluster.daemon.coordinator.core.scheduling import avoidance, elastic, preemption
from tfcluster.daemon.coordinator.core.scheduling import queue
from tfcluster.daemon.coordinator.core.scheduling.placement import NodeCapacity, TaskPlacement, Unfit
from tfcluster.daemon.coordinator.core.scheduling.policy import Policy
from tfcluster.daemon.logformat import fields
from tfcluster.model import WORKER
from tfcluster.states import JobState

log = logging.getLogger("tfcluster.coordinator")


class Scheduled(Protocol):
    """What a pass reads and changes of the cluster it schedules (core/cluster.py's Cluster)."""
    nodes: Nodes
    jobs: Jobs
    unfit_at: dict[str, int]  # PENDING job -> capacity version at which it last did not fit
    holds: dict[str, queue.Hold]
    no_growth_at: dict[str, int]  # elastic job -> capacity version at which it could not grow
    policy: Policy
    observer: Observer

    def capacity(self, now: float) -> list[NodeCapacity]: ...

    def queue_usage(self, now: float) -> queue.Usage: ...

    def settle(self, job: Job, commands: list[Command]) -> list[Command]: ...


class SchedulePass:
    def __init__(self, cluster: Scheduled, now: float):
        self.cluster, self.now = cluster, now
        self.version = cluster.nodes.capacity_version  # a job that did not fit at this version is not tried again
        self.capacity = {n.name: n for n in cluster.capacity(now)}
        # What preempted jobs gave up, kept for their preemptor.
        self.held: dict[str, preemption.Holdings] = preemption.holdings(cluster.jobs.live.values())

    def run(self, repairs: list[Job], pending: list[Job]) -> list[Command]:
        commands: list[Command] = []
        for job in repairs:
            commands += self._place_lost_tasks(job)
        if pending:
            commands += self._place_queue(pending)
        return commands

    def _take(self, placement: list[TaskPlacement]) -> None:
        """What a job now holds is not free for the next one."""
        for p in placement:
            self.capacity[p.node] = self.capacity[p.node].taking(p)

    def _did_not_fit(self, job: Job) -> None:
        self.cluster.unfit_at[job.id] = self.version

    def _fits(self, job: Job) -> None:
        self.cluster.unfit_at.pop(job.id, None)

    def _place_lost_tasks(self, job: Job) -> list[Command]:
        """A running job's tasks whose node was lost go elsewhere first: the job already holds its place."""
        unplaced = lifecycle.unplaced_tasks(job, self.now)
        result = avoidance.place_avoiding(job, preemption.free_for(job, self.capacity, self.held),
                                          only={(t.type, t.index) for t in unplaced})
        if isinstance(result, Unfit):
            self._did_not_fit(job)
            return []
        self._fits(job)
        self._take(result)
        return self.cluster.settle(job, lifecycle.place_again(job, result, self.cluster.nodes.info_of, self.now))

    def _place_queue(self, pending: list[Job]) -> list[Command]:
        """Jobs that preempted others go first, on what was kept for them; then the queue, in order, on what is
        kept for none; then the jobs that wait for resources may preempt."""
        cluster, commands = self.cluster, []
        unfit = sorted((job for job in pending if job.id in self.held), key=lambda job: job.number)
        # The queue is the jobs nothing was kept for, taken before the preemptors are placed: a preemptor placed
        # now leaves self.held, and must not be placed a second time where the same pass freed more.
        # A job that did not fit at this capacity version and holds nothing is passed over without a word (what
        # skip() does for it is nothing), so it is left out before ordering: a pass then orders and walks the
        # jobs new to the queue and the holders, not the thousands that wait as they did.
        version, unfit_at, holds = self.version, cluster.unfit_at, cluster.holds
        queued = [job for job in pending if job.id not in self.held and
                  (unfit_at.get(job.id) != version or job.id in holds)]
        for job in unfit[:]:
            commands += self._place_preemptor(job, unfit)
        kept = {n.name: n for n in preemption.free_for(None, self.capacity, self.held)}
        usage = cluster.queue_usage(self.now) if cluster.policy.source else queue.NO_USAGE
        turn = queue.QueuePass(kept, cluster.holds, cluster.holdings(), usage,
                               cluster.nodes.idle)
        for job in queue.order(queued, usage.shares):
            if unfit_at.get(job.id) == version:
                turn.skip(job)
                continue
            # A job is tried again only once the capacity version moved, and then every job behind it is too: what
            # it held and did not take needs no announcement.
            result = turn.consider(job)
            if isinstance(result, queue.Waiting):
                self._did_not_fit(job)
                lifecycle.waits(job, result.reason)
                if result.for_resources:
                    unfit.append(job)
                continue
            self._fits(job)
            turn.took(job, result)
            commands += self._placed(job, result)
        return commands + self._preempt(unfit, kept)

    def _place_preemptor(self, job: Job, unfit: list[Job]) -> list[Command]:
        """A job for which others were preempted, placed once what they held is free."""
        previous = {(t.type, t.index): (t.node, t.port) for t in job.tasks if t.node}
        quotas = self.cluster.holdings()
        result = avoidance.place_avoiding(job, preemption.free_for(job, self.capacity, self.held), previous=previous,
                                          largest=quotas.largest_size(job))
        if isinstance(result, Unfit):
            self._did_not_fit(job)
            lifecycle.waits(job, f"waiting for resources: {result.reason}")
            return []
        unfit.remove(job)
        self._fits(job)
        preemption.release(job.id, self.cluster.jobs.live.values())
        del self.held[job.id]
        self._take(result)
        return self._placed(job, result)

    def _placed(self, job: Job, placement: list[TaskPlacement]) -> list[Command]:
        commands = self.cluster.settle(job, lifecycle.place(job, placement, self.cluster.nodes.info_of, self.now))
        avoiding = avoidance.note(job)  # placed away from the nodes it keeps failing on: said, while it runs
        if avoiding:
            job.message = f"{avoiding}; {job.message}" if job.message else avoiding
        self.cluster.observer.placed(job, max(0.0, self.now - max(job.created, job.not_before)))
        return commands

    def _preempt(self, unfit: list[Job], capacity: dict[str, NodeCapacity]) -> list[Command]:
        """Jobs that did not fit, the highest class first, take resources from placed jobs of lower, preemptible
        classes where that makes them fit (preemption.py)."""
        live = self.cluster.jobs.live.values()
        takeable: list[Job] | None = None  # worked out once, when some job may preempt
        lowest: int | None = None  # the lowest class among them
        commands: list[Command] = []
        ordered = sorted(unfit, key=lambda j: -j.rank)
        top = ordered[0].rank if ordered else 0  # only jobs of a lower class than this may ever be taken from
        for job in ordered:
            if job.id in self.held:  # its victims are stopping; once they are gone and it still does not fit (a node
                # of theirs was lost), what they held is free for anyone again and it may preempt anew
                if not preemption.still_stopping(job.id, live) and preemption.release(job.id, live):
                    self.cluster.nodes.resources_changed()
                continue
            if takeable is None:
                takeable = [j for j in live if j.rank < top and preemption.may_take_from(j)]
                lowest = min((j.rank for j in takeable), default=None)  # a queue of hundreds asks it of each
            if lowest is None or job.rank <= lowest:
                continue
            victims = preemption.choose_victims(job, preemption.candidates(job, takeable),
                                                preemption.free_for(job, capacity, self.held))
            for victim in victims:
                commands += self.cluster.settle(victim, back_to_queue.preempt(victim, job, self.now))
                takeable.remove(victim)
            if victims:
                lowest = min((j.rank for j in takeable), default=None)
            victims = [v for v in victims if v.held_for == job.id]  # those restart.preempted did not refuse
            if victims:
                self.held[job.id] = preemption.held_by(victims)
                log.info("%s preempts %s", job.id, ", ".join(v.id for v in victims), extra=fields(job=job.id))
        return commands


def grow_elastic(cluster: Scheduled, now: float) -> list[Command]:
    """Elastic jobs that more workers fit for now grow (scheduling/elastic.py); one that does not is looked at
    again once the capacity changed."""
    version, waiting, free, quotas, commands = cluster.nodes.capacity_version, None, None, None, []
    live = cluster.jobs.live.values()
    # Read among the jobs the tick looks at (every running one is), not the thousands that may wait.
    for job in [j for j in cluster.jobs.ticking.values()
                if j.state == JobState.RUNNING and j.spec.role(WORKER).elastic]:
        if cluster.no_growth_at.get(job.id) == version:
            continue
        if waiting is None:
            waiting = [j for j in live if j.state == JobState.PENDING]
        if not elastic.may_grow(job, waiting, now):
            continue
        if free is None:  # what is kept for a preemptor is not free
            free = preemption.free_for(None, {n.name: n for n in cluster.capacity(now)}, preemption.holdings(live))
        if quotas is None:
            quotas = cluster.holdings()
        own = sum(len(t.gpus) for t in job.tasks if job.holds(t))  # given back by the group restart that grows it
        workers = elastic.grow_to(job, free, quotas.largest_size(job, holding=own))
        if workers:
            commands += cluster.settle(job, back_to_queue.grow(job, workers, now))
            free = quotas = None
        else:
            cluster.no_growth_at[job.id] = version
    return commands
