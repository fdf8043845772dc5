"""`tfcluster doctor`'s verdicts, one Check each with the exact fix: what the model says of every node (lost,
drained, low on disk, another version, a sick GPU, a certificate its agent failed to renew, GPU nodes on
different NVIDIA drivers), and what the agents' probes found (rpc/doctor.py asks them): clock skew,
a task port each node could open, real TCP connects between the nodes' peer ports and task ranges, the interface
NCCL will use. Pure: the answers and the time are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcluster.commands import ProbeAnswer, ProbeTarget
from tfcluster.daemon.coordinator.core.model.node import Node
from tfcluster.model import NodeInfo
from tfcluster.states import NodeState

OK, WARN, FAIL = "ok", "warn", "fail"
CLOCK_SKEW_LIMIT_SECONDS = 1.0  # certificates, leases and the evaluator's checkpoint times all read wall clocks
PEERS_PROBED = 8  # each node connects to the next this many nodes (by name): the cost stays linear in the nodes
LISTEN_SECONDS = 10.0  # how long each node keeps its probed task port open
# Agents renew their certificates at two thirds of the life (pki.RENEW_AT): one still unrenewed at five sixths failed.
NODE_CERT_OVERDUE_AT = 5 / 6


@dataclass(frozen=True)
class Check:
    name: str
    subject: str
    level: str
    message: str
    fix: str = ""


def node_checks(nodes: list[Node], version: str, now: float) -> list[Check]:
    """What the coordinator knows of each node without asking it."""
    checks = []
    for node in nodes:
        i = node.info
        if node.state != NodeState.READY:
            checks.append(Check("node", node.name, FAIL, f"LOST: not heard from for {now - node.seen.last_seen:.0f} s"
                                if node.seen.last_seen else "LOST", f"start its agent on {i.hostname or i.address} "
                                "(systemctl status tfcluster-agent), or `tfcluster node remove "
                                f"{node.name}` if it is gone for good"))
            continue
        if node.drain is not None:
            checks.append(Check("node", node.name, WARN, node.drain.words(),
                                f"`tfcluster node resume {node.name}` once it is fit for work"))
        if node.condition:
            checks.append(Check("node", node.name, WARN, f"takes no new tasks: {node.condition}",
                                "free disk under the agent's state dir (`tfcluster gc`), or lower --min-free-disk"))
        if i.agent_version != version:
            checks.append(Check("version", node.name, WARN, f"agent {i.agent_version or 'unknown'}, coordinator "
                                f"{version}", "upgrade the agent to the coordinator's release"))
        checks += _sick_gpus(node) + _certificate(node, now)
        if node.drain is None and not node.condition and i.agent_version == version:
            checks.append(Check("node", node.name, OK, f"READY, {len(i.gpus)} GPUs{_driver(i)}, "
                                f"agent {i.agent_version}"))
    return checks + _drivers(nodes)


def _driver(info: NodeInfo) -> str:
    if not info.gpu_driver:
        return ""
    return f" (driver {info.gpu_driver}" + (f", CUDA {info.cuda_version})" if info.cuda_version else ")")


def _drivers(nodes: list[Node]) -> list[Check]:
    """One warning when the READY GPU nodes run more than one NVIDIA driver: a job across them may fail in NCCL,
    or run where its CUDA build is too new for the driver."""
    versions: dict[str, list[str]] = {}
    for node in nodes:
        if node.state == NodeState.READY and node.info.gpus and node.info.gpu_driver:
            versions.setdefault(node.info.gpu_driver, []).append(node.name)
    if len(versions) < 2:
        return []
    ranked = sorted(versions.items(), key=lambda kv: (-len(kv[1]), kv[0]))  # the most common first
    shown = "; ".join(f"{v} on {', '.join(sorted(names)[:4])}{' ...' if len(names) > 4 else ''}"
                      for v, names in ranked)
    return [Check("gpu-driver", "cluster", WARN, f"{len(versions)} NVIDIA driver versions: {shown}",
                  f"install one driver version ({ranked[0][0]}) on every GPU node, then restart their agents")]


def _sick_gpus(node: Node) -> list[Check]:
    return [Check("gpu", node.name, WARN, f"{c.words(node.name)}: left out of placement",
                  "service the GPU (reset it with `nvidia-smi -r` once idle, or reboot), then restart the agent")
            for c in node.seen.conditions if c.excludes]


def _certificate(node: Node, now: float) -> list[Check]:
    """The certificate its agent registered with, when its agent has not renewed it in time (the renewal was
    refused, or cannot reach the coordinator)."""
    issued, expires = node.seen.cert_issued, node.seen.cert_expires
    if not expires or now < issued + (expires - issued) * NODE_CERT_OVERDUE_AT:
        return []
    left = expires - now
    fix = ("read the agent's log for the renewal's error (journalctl -u tfcluster-agent); if the node was removed, "
           f"`tfcluster token create --node {node.name}` and join it again")
    if left <= 0:
        return [Check("tls", node.name, FAIL, "its certificate has expired: its agent cannot register again", fix)]
    return [Check("tls", node.name, WARN, f"its certificate expires in {left / 3600:.0f} h and was not renewed", fix)]


def targets(ready: list[NodeInfo], ports: dict[str, int]) -> dict[str, tuple[ProbeTarget, ...]]:
    """node -> what it connects to: the next PEERS_PROBED nodes' peer ports and the task ports they opened."""
    plan = {}
    for n, info in enumerate(ready):
        peers = [ready[(n + k) % len(ready)] for k in range(1, min(PEERS_PROBED, len(ready) - 1) + 1)]
        plan[info.name] = tuple(
            [ProbeTarget(p.name, p.address, p.peer_port, "peer") for p in peers if p.peer_port] +
            [ProbeTarget(p.name, p.address, ports[p.name], "tasks") for p in peers if ports.get(p.name)])
    return plan


def probe_checks(ready: list[NodeInfo], listened: dict[str, tuple[ProbeAnswer, float]],
                 connected: dict[str, tuple[ProbeAnswer, float]]) -> list[Check]:
    """The verdicts on what the agents answered (each answer with the coordinator's time when it came)."""
    checks = []
    by_name = {info.name: info for info in ready}
    for info in ready:
        heard = connected.get(info.name) or listened.get(info.name)
        if heard is None:
            checks.append(Check("probe", info.name, FAIL, "its agent did not answer the probe",
                                "upgrade the agent (probes came in 0.8), or look at its log"))
            continue
        checks += _clock(info.name, *heard)
        checks += _listened(info, listened.get(info.name))
        checks.append(Check("nccl", info.name, OK if heard[0].interface else WARN,
                            f"NCCL_SOCKET_IFNAME={heard[0].interface} (its advertise address {info.address})"
                            if heard[0].interface else f"no interface here holds its advertise address {info.address}",
                            "" if heard[0].interface else "give the agent --advertise-address, an address of this "
                                                          "host that the other nodes reach"))
    for source, (answer, _) in sorted(connected.items()):
        for o in answer.outcomes:
            subject = f"{source} -> {o.target.node} {o.target.address}:{o.target.port}"
            if o.ok:
                checks.append(Check("ports", subject, OK, f"{_what(o.target)} reached in {o.seconds * 1000:.0f} ms"))
            else:
                checks.append(Check("ports", subject, FAIL, f"{_what(o.target)} not reached: {o.error}",
                                    _port_fix(by_name.get(o.target.node), source, o.target)))
    return checks


def _clock(name: str, answer: ProbeAnswer, received: float) -> list[Check]:
    skew = answer.agent_time - received
    if abs(skew) > CLOCK_SKEW_LIMIT_SECONDS:
        return [Check("clock", name, FAIL, f"{skew:+.1f} s from the coordinator's clock",
                      "keep every host's clock in sync (chrony or systemd-timesyncd against the same servers)")]
    return [Check("clock", name, OK, f"{skew:+.2f} s from the coordinator's clock")]


def _listened(info: NodeInfo, heard: tuple[ProbeAnswer, float] | None) -> list[Check]:
    if heard is None or heard[0].port:
        return []
    return [Check("ports", info.name, FAIL, f"could not open a task port: {heard[0].error}",
                  "free some of its --port-range (another program holds them), or give the agent a wider one")]


def _what(target: ProbeTarget) -> str:
    return "its peer port (checkpoints, code)" if target.what == "peer" else "a port of its task range"


def _port_fix(target: NodeInfo | None, source: str, t: ProbeTarget) -> str:
    if target is None:
        return ""
    if t.what == "peer":
        return f"let {source} reach TCP port {t.port} of {t.address} (its --peer-port)"
    return (f"let the other nodes reach TCP ports {target.port_range[0]}-{target.port_range[1]} of {t.address} (its "
            f"--port-range), and check that {t.address} (its --advertise-address) routes from {source}")
