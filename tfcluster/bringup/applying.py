"""One `up`, `upgrade` or `down` as it runs (Run: the inventory, what each host's probe found, the failures so
far), and the steps of a plan carried out on hosts: each host's over one SSH call to remote.py, several hosts in
parallel. A host that fails is named with its step, what was done and what to do; the others go on."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tfcluster.bringup import plan as planning
from tfcluster.bringup import upgrade
from tfcluster.bringup.desired import WHEELHOUSE_DIR
from tfcluster.bringup.inventory import Host, Inventory
from tfcluster.bringup.ssh import Connections, SshError


class Failed(Exception):
    """`up` or `down` could not finish; the message names the host, the step and the remedy."""


@dataclass
class Run:
    inventory: Inventory
    operator_dir: Path                 # the CA and the admin's credentials live here
    say: Callable[[str], None]
    check: bool = False
    batch: int = upgrade.DEFAULT_BATCH  # agents upgraded at a time (upgrade.py)
    upgrade_only: bool = False         # `tfcluster upgrade`: every host must be up already
    started: float = field(default_factory=time.monotonic)
    facts: dict[str, dict] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def each(self, hosts, work: Callable[[Host], object]) -> dict[str, object]:
        """work(host) for each host in parallel; a host whose work raised SshError/Failed is recorded as failed."""
        results: dict[str, object] = {}

        def guarded(host: Host):
            try:
                results[host.host] = work(host)
            except (SshError, Failed) as e:
                self.failures.append(f"{host.host}: {e}")
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as pool:
            list(pool.map(guarded, hosts))
        return results

    def stop_on_failures(self, during: str) -> None:
        if self.failures:
            raise Failed(f"{during} failed on {len(self.failures)} host(s):\n  " + "\n  ".join(self.failures))


def apply(run: Run, ssh: Connections, hosts: list[Host], plans: dict[str, planning.HostPlan],
          wheelhouses: dict[tuple[str, str], Path], tokens: dict[str, str]) -> None:
    def one(host: Host) -> None:
        plan = plans[host.host]
        if plan.needs_wheelhouse:
            facts = run.facts[host.host]
            try:
                ssh.send_tree(host, wheelhouses[(facts["python"], facts["machine"])], WHEELHOUSE_DIR)
            except SshError as e:
                raise Failed(f"step copy the wheelhouse: {e}") from None
        steps = planning.with_token(plan, tokens[host.host]) if host.host in tokens else plan.steps
        apply_steps(ssh, host, steps)
    run.each([h for h in hosts if plans[h.host].steps or h.host in tokens], one)
    run.stop_on_failures("applying")


def apply_steps_on(ssh: Connections, host: Host, steps: list[planning.Step]) -> None:
    """apply_steps outside run.each (which names the host itself): a failure, even to reach the host, says which."""
    try:
        apply_steps(ssh, host, steps)
    except (SshError, Failed) as e:
        raise Failed(f"{host.host}: {e}") from None


def apply_steps(ssh: Connections, host: Host, steps: list[planning.Step]) -> None:
    if not steps:
        return
    answer = ssh.helper(host, {"op": "apply", "steps": [dict(s.action, name=s.name) for s in steps]})
    if "failed" in answer:
        left = [s.name for s in steps][len(answer["done"]):]
        raise Failed(f"step {answer['failed']!r} failed: {answer['error']}\n    done: {len(answer['done'])} step(s); "
                     f"not done: {', '.join(left)}\n    remedy: fix the cause, then run `tfcluster up` again: it "
                     f"redoes only what is not done")
