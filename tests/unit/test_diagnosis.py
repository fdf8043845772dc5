"""`tfcluster doctor`'s verdicts from what agents answered (core/diagnosis.py): who probes whom, a skewed clock, a
node that could not open a task port, one that did not answer, a port not reached, each with its fix."""

from __future__ import annotations

from dataclasses import replace

from coresim import info

from tfcluster.commands import ProbeAnswer, ProbeOutcome, ProbeTarget
from tfcluster.daemon.coordinator.core import diagnosis
from tfcluster.daemon.coordinator.core.diagnosis import FAIL, OK


def nodes(n: int):
    return [info(f"n{i}") for i in range(n)]


def test_each_node_probes_the_next_few_peer_ports_and_the_task_ports_they_opened():
    ready = [replace(i, peer_port=19999) for i in nodes(12)]
    plan = diagnosis.targets(ready, {"n1": 20050})
    assert len(plan) == 12 and all(len([t for t in ts if t.what == "peer"]) == diagnosis.PEERS_PROBED
                                   for ts in plan.values())
    assert [t.node for t in plan["n0"] if t.what == "tasks"] == ["n1"], "only where a port was opened"
    assert {t.node for t in plan["n11"]} == {f"n{i}" for i in range(8)}, "round the ring"
    assert diagnosis.targets(ready[:1], {}) == {"n0": ()}, "a lone node has nobody to reach"


def test_verdicts_name_what_is_wrong_and_the_fix():
    a, b, c = nodes(3)
    target = ProbeTarget("n1", b.address, 20050, "tasks")
    listened = {"n0": (ProbeAnswer(1, port=20051, agent_time=100.0, interface="eth0"), 100.0),
                "n1": (ProbeAnswer(1, error="no free port in the task range 20000-20099", agent_time=103.5), 100.0)}
    connected = {"n0": (ProbeAnswer(2, outcomes=(ProbeOutcome(target, False, "timed out"),), agent_time=101.0,
                                    interface="eth0"), 101.0)}
    checks = {(c.name, c.subject): c for c in diagnosis.probe_checks([a, b, c], listened, connected)}
    assert checks[("clock", "n0")].level == OK
    assert checks[("clock", "n1")].level == FAIL and "+3.5 s" in checks[("clock", "n1")].message
    assert checks[("ports", "n1")].level == FAIL and "--port-range" in checks[("ports", "n1")].fix
    assert checks[("probe", "n2")].level == FAIL, "no answer"
    port = checks[("ports", f"n0 -> n1 {b.address}:20050")]
    assert port.level == FAIL and "TCP ports 20000-20099" in port.fix and "--advertise-address" in port.fix
    assert checks[("nccl", "n0")].message.startswith("NCCL_SOCKET_IFNAME=eth0")


def test_a_sick_gpu_and_a_certificate_not_renewed_in_time_are_named_with_their_fix():
    from tfcluster.conditions import NodeCondition
    from tfcluster.daemon.coordinator.core.model.node import Node
    from tfcluster.states import NodeState

    now = 1_000_000.0
    sick, late, gone, fine = (Node(info(name), state=NodeState.READY) for name in ("sick", "late", "gone", "fine"))
    sick.seen.conditions = (NodeCondition(1, "ecc-uncorrectable", "uncorrectable ECC errors: 2", now - 60),
                            NodeCondition(0, "throttled", "HW thermal slowdown", now - 60))
    day = 86400
    late.seen.cert_issued, late.seen.cert_expires = now - 29 * day + 2 * 3600, now + 2 * 3600  # past 5/6 of 30 days
    gone.seen.cert_issued, gone.seen.cert_expires = now - 30 * day, now - 1
    fine.seen.cert_issued, fine.seen.cert_expires = now - 21 * day, now + 9 * day  # due to renew: not yet overdue
    checks = diagnosis.node_checks([sick, late, gone, fine], fine.info.agent_version, now)
    found = [(c.name, c.subject, c.level) for c in checks if c.level != OK]
    assert found == [("gpu", "sick", "warn"), ("tls", "late", "warn"), ("tls", "gone", FAIL)]
    gpu = next(c for c in checks if c.name == "gpu")
    assert "GPU 1 of node sick" in gpu.message and "nvidia-smi -r" in gpu.fix, "throttling alone is not a problem"
    late_check = next(c for c in checks if c.subject == "late")
    assert "expires in 2 h" in late_check.message and "journalctl -u tfcluster-agent" in late_check.fix


def test_gpu_nodes_on_different_nvidia_drivers_are_one_warning_naming_each_version_and_its_nodes():
    from tfcluster.daemon.coordinator.core.model.node import Node
    from tfcluster.states import NodeState

    def node(name, driver, gpus=1, state=NodeState.READY):
        return Node(replace(info(name, gpus), gpu_driver=driver, cuda_version="13.0" if driver else ""), state=state)

    same = [node("a", "580.159.04"), node("b", "580.159.04"), node("cpu", "", gpus=0)]
    checks = diagnosis.node_checks(same, same[0].info.agent_version, 0.0)
    assert [c.level for c in checks] == [OK, OK, OK]
    assert "READY, 1 GPUs (driver 580.159.04, CUDA 13.0), agent" in checks[0].message
    mixed = same + [node("c", "570.86.10"), node("lost", "550.1", state=NodeState.LOST)]
    checks = diagnosis.node_checks(mixed, same[0].info.agent_version, 0.0)
    drivers = [c for c in checks if c.name == "gpu-driver"]
    assert len(drivers) == 1 and drivers[0].level == "warn", "a LOST node's driver is not counted"
    assert drivers[0].message == "2 NVIDIA driver versions: 580.159.04 on a, b; 570.86.10 on c"
    assert "install one driver version (580.159.04)" in drivers[0].fix
