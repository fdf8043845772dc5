"""A client of the coordinator's ControlService, and the JSON shape `tfcluster status --json` prints.

gRPC failures become ClientError with one line a person can act on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import grpc

from tfcluster.api.v1 import control_pb2, control_pb2_grpc
from tfcluster.auth import TOKEN_FILE_ENV, TokenError, channel as auth_channel, client_token
from tfcluster.spec import JobSpec
from tfcluster.wire import spec_to_proto

DEFAULT_COORDINATOR = "localhost:7070"
RPC_TIMEOUT_SECONDS = 10.0


class ClientError(Exception):
    """One line for the user; exit_code 2 for bad input, 1 otherwise."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def default_coordinator() -> str:
    return os.environ.get("TFCLUSTER_COORDINATOR") or DEFAULT_COORDINATOR


class Client:
    def __init__(self, coordinator: str | None = None, token: str | None = None):
        self.address = coordinator or default_coordinator()
        if token is None:
            try:
                token = client_token()
            except TokenError as e:
                raise ClientError(f"{TOKEN_FILE_ENV}: {e}", exit_code=2) from None
        self.channel = auth_channel(self.address, token)
        self.stub = control_pb2_grpc.ControlServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, timeout: float = RPC_TIMEOUT_SECONDS):
        try:
            return method(request, timeout=timeout, wait_for_ready=False)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def _error(self, e: grpc.RpcError) -> ClientError:
        code, details = e.code(), e.details() or ""
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and \
                "disconnected" not in details and "is not connected" not in details:
            return ClientError(f"cannot reach the coordinator at {self.address} ({details.splitlines()[0] if details else code.name}); "
                               f"is `tfcluster coordinator` running? (set --coordinator or TFCLUSTER_COORDINATOR)")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return ClientError(details, exit_code=2)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return ClientError(f"the coordinator at {self.address} refused the request: {details}; "
                               f"point {TOKEN_FILE_ENV} at the cluster's token file")
        return ClientError(details or code.name)

    def submit(self, spec: JobSpec) -> str:
        return self._call(self.stub.SubmitJob, control_pb2.SubmitJobRequest(spec=spec_to_proto(spec))).job_id

    def plan(self, spec: JobSpec) -> control_pb2.PlanJobResponse:
        return self._call(self.stub.PlanJob, control_pb2.PlanJobRequest(spec=spec_to_proto(spec)))

    def stop(self, job_id: str, graceful: bool = True) -> str:
        return self._call(self.stub.StopJob, control_pb2.StopJobRequest(job_id=job_id, graceful=graceful)).state

    def status(self, job_id: str = "") -> control_pb2.GetStatusResponse:
        return self._call(self.stub.GetStatus, control_pb2.GetStatusRequest(job_id=job_id))

    def logs(self, job_id: str, task_type: str, task_index: int, follow: bool = False, tail_lines: int = 0,
             attempt: int = 0) -> Iterator[bytes]:
        request = control_pb2.StreamLogsRequest(job_id=job_id, task_type=task_type, task_index=task_index,
                                                follow=follow, tail_lines=tail_lines, attempt=attempt)
        call = self.stub.StreamLogs(request, timeout=None if follow else 60.0)
        try:
            for chunk in call:
                yield chunk.data
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                return
            raise self._error(e) from None
        finally:
            call.cancel()


# ---- the documented JSON shape (DESIGN.md: CLI contract) -----------------------------------------

def gpu_dict(g) -> dict[str, Any]:
    return {"index": g.index, "uuid": g.uuid, "name": g.name, "memory_mib": g.memory_mib}


def evaluation_dict(e) -> dict[str, Any]:
    return {"checkpoint": e.checkpoint, "step": e.step, "metrics": dict(e.metrics), "time": e.time}


def failure_dict(f) -> dict[str, Any]:
    return {"task": f.task, "node": f.node, "exit_code": f.exit_code if f.HasField("exit_code") else None,
            "signal": f.signal if f.HasField("signal") else None, "message": f.message,
            "log_tail": list(f.log_tail), "time": f.time, "description": f.description}


def status_dict(response: control_pb2.GetStatusResponse) -> dict[str, Any]:
    nodes = [{"name": n.name, "address": n.address, "state": n.state, "gpus": [gpu_dict(g) for g in n.gpus],
              "hostname": n.hostname, "cpu_count": n.cpu_count, "memory_bytes": n.memory_bytes,
              "agent_version": n.agent_version, "last_seen_seconds_ago": round(n.last_seen_seconds_ago, 3),
              "port_range": [n.port_range_start, n.port_range_end], "running_tasks": n.running_tasks}
             for n in response.nodes]
    jobs = []
    for j in response.jobs:
        tasks = [{"type": t.type, "index": t.index, "node": t.node, "address": t.address,
                  "gpus": [gpu_dict(g) for g in t.gpus], "state": t.state, "pid": t.pid or None,
                  "exit_code": t.exit_code if t.HasField("exit_code") else None,
                  "signal": t.signal if t.HasField("signal") else None,
                  "attempt": t.attempt, "message": t.message, "tf_config": t.tf_config} for t in j.tasks]
        jobs.append({"id": j.id, "name": j.name, "state": j.state, "strategy": j.strategy, "restarts": j.restarts,
                     "message": j.message, "created": j.created, "finished": j.finished or None, "tasks": tasks,
                     "evaluation": {"latest": evaluation_dict(j.last_evaluation) if j.HasField("last_evaluation")
                                    else None,
                                    "history": [evaluation_dict(e) for e in j.evaluations]},
                     "last_failure": failure_dict(j.last_failure) if j.HasField("last_failure") else None,
                     "evaluator_restarts": j.evaluator_restarts, "preemptions": j.preemptions})
    return {"nodes": nodes, "jobs": jobs}
