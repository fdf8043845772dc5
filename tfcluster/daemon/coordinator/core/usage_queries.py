"""What owners have used, as the cluster is asked it (core/cluster.py's Cluster): fair share and the GPU-hours of
each quota's window for every scheduling pass, what each quota's subject holds now, and `tfcluster usage`'s
totals. The ended jobs' part comes from the usage ledger (core/model/ledger.py), which keeps sums for what a
pass asks; the live jobs' is added up to now.
"""

from __future__ import annotations

from tfcluster.daemon.coordinator.core.model import accounting
from tfcluster.daemon.coordinator.core.model.held import Held
from tfcluster.daemon.coordinator.core.model.job_table import Jobs
from tfcluster.daemon.coordinator.core.model.ledger import Ledger
from tfcluster.daemon.coordinator.core.scheduling import queue
from tfcluster.daemon.coordinator.core.scheduling.policy import Policy


class UsageQueries:
    """The cluster's usage queries; they use its jobs, held, usage ledger and policy."""
    jobs: Jobs
    held: Held
    usage: Ledger
    policy: Policy

    def queue_usage(self, now: float) -> queue.Usage:
        """Owners' GPU-hours as the queue needs them, from the usage ledger (ledger.py): fair share decayed
        with the policy's half-life, and the GPU-hours of each quota's window."""
        used: dict[str, float] = {}
        windows = self.policy.gpu_hour_windows()
        live = self._live_entries(now) if windows else []
        for seconds in set(windows.values()):
            totals = self.gpu_hours_within(seconds, now, live)
            used.update({key: totals.get(key, 0.0) for key, window in windows.items() if window == seconds})
        return queue.Usage(shares=self.fair_share(now, self.policy.fair_share_half_life), used_gpu_hours=used)

    def holdings(self) -> queue.Holdings:
        """What each quota's subject holds now: from what the placed tasks hold (Held), not from every live job."""
        return queue.Holdings(self.policy, ((self.jobs.live[job_id], gpus) for job_id, gpus in self.held.jobs()))

    def fair_share(self, now: float, half_life: float) -> dict[str, float]:
        """Owner -> decayed GPU-hours at now (each GPU-hour used at time t weighs 0.5 ** ((now - t) /
        half_life)): the ledger's ended jobs and the live ones up to now. Owners who used nothing are absent.
        Cheap enough for every scheduling pass: sums kept per half-life, plus one pass over the live jobs."""
        live = ((job.owner, *accounting.accrued(job, now)) for job in self.jobs.live.values())
        return self.usage.decayed(now, half_life, live)

    def gpu_hours_since(self, since: float, now: float) -> dict[str, float]:
        """User name, and "group:NAME" for each group -> GPU-hours used between since and now (running jobs
        up to now; a job's use taken as spread evenly over its run)."""
        return self.gpu_hours_within(now - since, now, self._live_entries(now))

    def gpu_hours_within(self, seconds: float, now: float, live: list[accounting.Entry]) -> dict[str, float]:
        """gpu_hours_since for the window of the last `seconds`, the live jobs given as entries. Asked on every
        scheduling pass for each quota's window, by its length: the ledger keeps sums for each (ledger.py)."""
        return {key: used / 3600.0 for key, used in self.usage.gpu_seconds_within(seconds, now, live).items()}

    def usage_totals(self, since: float, now: float) -> dict[str, accounting.Totals]:
        """User name, and "group:NAME" for each group -> what their jobs used between since and now."""
        return self.usage.totals(since, now, self._live_entries(now))

    def _live_entries(self, now: float) -> list[accounting.Entry]:
        return [accounting.entry_of(job, now) for job in self.jobs.live.values()
                if job.usage.started or any(t.running_since for t in job.tasks)]
