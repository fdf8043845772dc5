"""From what a host should hold and what its probe found, the steps that make it so, and a line for each that
says what it changes. Pure (no I/O): the steps are data for remote.py; `--check` prints the lines alone.

A step is taken only where the host differs: software installed when the id in its virtualenv is not this
run's, a file written when its hash differs, a service (re)started when it is stopped or something it reads was
written, an agent given a join token only while it has no certificate. A host that already matches gets no step.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field

from tfcluster.bringup.desired import AGENT_UNIT, JOIN_TOKEN_FILE, WHEELHOUSE_DIR
from tfcluster.bringup.hostfiles import ETC, STATE_DIR, UNIT_DIR, Desired
from tfcluster.bringup.inventory import Host, Software

LOG_DIR = "/var/log/tfcluster"


@dataclass
class Step:
    name: str             # what the operator reads: "write /etc/tfcluster/tfcluster.env"
    action: dict          # what remote.py does


@dataclass
class HostPlan:
    host: Host
    steps: list[Step] = field(default_factory=list)
    needs_wheelhouse: bool = False
    needs_token: bool = False     # the caller adds the token's file: the token is made only when it is applied

    @property
    def installs(self) -> bool:
        return bool(self.steps) and self.steps[0].action["kind"] == "install"

    @property
    def changes(self) -> list[str]:
        return [s.name for s in self.steps] + (["join the cluster with a single-use token"] if self.needs_token else [])


def plan_up(host: Host, wanted: Desired, facts: dict, software: Software, software_id: str) -> HostPlan:
    plan = HostPlan(host)
    if facts.get("software") != software_id:
        plan.needs_wheelhouse = software.source == "wheelhouse"
        plan.steps.append(Step(f"install {software.requirement('*').replace('==*', '')} in {software.prefix}",
                               {"kind": "install", "prefix": software.prefix, "software": software_id,
                                "requirement": software.requirement(software_id.split("+")[0].split()[0]),
                                "wheelhouse": WHEELHOUSE_DIR if plan.needs_wheelhouse else None,
                                "index_url": software.index_url}))
    have = facts.get("files", {})
    written = set()
    for path, file in wanted.files.items():
        if have.get(path) != hashlib.sha256(file.data).hexdigest():
            written.add(path)
            verb = "rewrite" if have.get(path) else "write"
            plan.steps.append(Step(f"{verb} {path} ({file.mode:o})", write_action(path, file.data, file.mode)))
    plan.needs_token = host.agent and not facts.get("joined")
    running = facts.get("running", {})
    for name, service in wanted.services.items():
        changed = sorted(written.intersection(service.reads))
        why = ("it was not running" if not running.get(name) else
               "the software changed" if plan.installs and service.uses_software else
               f"{', '.join(changed)} changed" if changed else
               "it joins the cluster" if name == AGENT_UNIT and plan.needs_token else None)
        if why:
            plan.steps.append(Step(f"start {name} ({why})", {"kind": "start", "service": name,
                                                              "unit": f"{UNIT_DIR}/{name}",
                                                              "env_file": service.env_file}))
            if service.ready:
                plan.steps.append(Step(f"wait until {name} serves", service.ready))
    return plan


def write_action(path: str, data: bytes, mode: int) -> dict:
    return {"kind": "write", "path": path, "mode": f"{mode:o}", "data": base64.b64encode(data).decode()}


def token_step(token: str) -> Step:
    """The agent's join token, in a root-only file the agent reads (never on a command line); before the start."""
    return Step(f"write {JOIN_TOKEN_FILE} (600, a single-use join token)",
                write_action(JOIN_TOKEN_FILE, (token + "\n").encode(), 0o600))


def with_token(plan: HostPlan, token: str) -> list[Step]:
    """The plan's steps with the token's file written before the agent starts."""
    starts = [i for i, s in enumerate(plan.steps) if s.action["kind"] == "start"]
    at = starts[0] if starts else len(plan.steps)
    return plan.steps[:at] + [token_step(token)] + plan.steps[at:]


def until_agent_starts(plan: HostPlan) -> tuple[list[Step], list[Step]]:
    """The plan's steps before its agent's start, and the agent's start with what follows it. A coordinator host
    that is also a node runs the first part with the coordinators, the second once its join token exists (the
    coordinator makes it)."""
    return until_starts(plan, AGENT_UNIT)


def until_starts(plan: HostPlan, service: str) -> tuple[list[Step], list[Step]]:
    """The plan's steps before service's start, and its start with what follows it."""
    at = next((i for i, s in enumerate(plan.steps)
               if s.action["kind"] == "start" and s.action["service"] == service), len(plan.steps))
    return plan.steps[:at], plan.steps[at:]


def probed_dirs(software: Software) -> list[str]:
    """The dirs whose existence the probe reports, for `down`."""
    return [software.prefix, ETC, STATE_DIR, LOG_DIR]


def stop_step(service: str, why: str = "") -> Step:
    return Step(f"stop {service}" + (f" ({why})" if why else ""), {"kind": "stop", "service": service})


def plan_down(host: Host, services: list[str], facts: dict, software: Software, purge: bool) -> HostPlan:
    """Stops the services (given in the order they start) and removes the units, the token and the virtualenv;
    with purge also the state (etcd's data with it), the certificates and the logs."""
    plan = HostPlan(host)
    services = services[::-1]
    for service in services:
        if facts.get("running", {}).get(service):
            plan.steps.append(stop_step(service))
    have = facts.get("files", {})
    paths = [p for p in (f"{UNIT_DIR}/{s}" for s in services) if have.get(p)]
    if have.get(JOIN_TOKEN_FILE):
        paths.append(JOIN_TOKEN_FILE)
    dirs = facts.get("dirs", {})
    paths += [d for d in (software.prefix, *((ETC, STATE_DIR, LOG_DIR) if purge else ())) if dirs.get(d)]
    if paths:
        plan.steps.append(Step(f"remove {', '.join(paths)}", {"kind": "remove", "paths": paths}))
    return plan
