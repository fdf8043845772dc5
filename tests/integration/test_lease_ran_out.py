"""A leader whose lease ran out on its own clock (paused, or cut off from etcd) takes no registration: another
coordinator may lead by then, and what this one decides for the node it could not store. The agent is told so and
tries the next coordinator. Once etcd renews the lease, registrations go through again. (The whole takeover, with
etcd and a real agent, is tests/integration/test_leader_partition.py.)"""

from __future__ import annotations

import threading

import grpc
import pytest

from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc, control_pb2, control_pb2_grpc
from tfcluster.api.v1 import types_pb2 as pb
from tfcluster.daemon.coordinator.grpc_server import CoordinatorServer
from tfcluster.daemon.coordinator.process import BackgroundCoordinator
from tfcluster.leaders import LEASE_RAN_OUT, Coordinators, is_lease_ran_out

NODE = pb.NodeInfo(name="z", address="127.0.0.2", port_range_start=30000, port_range_end=30099,
                   state_dir="/var/lib/z")


def test_a_leader_whose_lease_ran_out_takes_no_registration_until_it_is_renewed(tmp_path):
    coordinator = BackgroundCoordinator(CoordinatorServer("127.0.0.1:0", tmp_path / "coordinator",
                                                          insecure=True)).start()
    lease_holds = threading.Event()
    coordinator.server.coordinator.acting = lease_holds.is_set  # as ha/runner.py sets it: leadership.holds
    try:
        with grpc.insecure_channel(coordinator.address) as channel:
            agents = agent_pb2_grpc.AgentServiceStub(channel)
            control = control_pb2_grpc.ControlServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                agents.Register(agent_pb2.RegisterRequest(node=NODE), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and is_lease_ran_out(refused.value)
            assert refused.value.details() == LEASE_RAN_OUT
            assert [n.name for n in control.GetStatus(control_pb2.GetStatusRequest(), timeout=5).nodes] == []
            # The agent's list moves on to the next coordinator, as for one that does not answer.
            coordinators = Coordinators("127.0.0.1:1,127.0.0.1:2")
            assert coordinators.failed(refused.value) and coordinators.current == "127.0.0.1:2"
            lease_holds.set()  # renewed: it acts again
            assert agents.Register(agent_pb2.RegisterRequest(node=NODE), timeout=5).session_id
            assert [n.name for n in control.GetStatus(control_pb2.GetStatusRequest(), timeout=5).nodes] == ["z"]
    finally:
        coordinator.stop()
