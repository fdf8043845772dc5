"""The ControlService calls of sweeps: StartSweep, GetSweep, ListSweeps, StopSweep. The sweep itself lives in the
core (core/sweep_events.py) and the store, so it goes on across a restart and a failover; these calls only start,
show and stop it. Access follows the job rules (core/access/rules.py): a user sees and stops their own sweeps, a
viewer sees every sweep, an admin may do anything.
"""

from __future__ import annotations

import logging

import grpc

from tfcluster import security, wire
from tfcluster.api.v1 import control_pb2
from tfcluster.daemon.coordinator.core.access import rules as access
from tfcluster.daemon.coordinator.core.cluster import Unplaceable
from tfcluster.daemon.coordinator.core.model.sweep import Sweep
from tfcluster.daemon.coordinator.core.scheduling.policy import ClassRefused
from tfcluster.daemon.logformat import fields
from tfcluster.spec import SpecError

log = logging.getLogger("tfcluster.coordinator")


class SweepServicer:
    """Mixed into the ControlService's servicer; `self.c` is the Coordinator."""

    async def StartSweep(self, request, context):
        c = self.c.cluster
        try:
            spec = wire.spec_from_proto(request.spec)
            sweep_spec = wire.sweep_spec_from_proto(request.sweep)
            await self._check_code(spec, context)
            who = security.caller()
            sweep, commands = c.start_sweep(spec, sweep_spec, self.c.clock(), request.client_request_id[:128],
                                            owner=who.name if who else "", groups=who.groups if who else ())
        except (SpecError, ClassRefused) as e:  # as SubmitJob answers them
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Unplaceable as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"the sweep's trials cannot ever be placed: {e}")
        await self._acknowledged(self.c.apply(commands), context)  # acknowledged only once stored
        log.info("%s started: %d trials, %d at once", sweep, len(sweep.parameters), sweep.sweep.max_concurrent,
                 extra=fields(job=sweep.id))
        return control_pb2.StartSweepResponse(sweep_id=sweep.id, state=sweep.state.value)

    async def GetSweep(self, request, context):
        sweep = await self._sweep(request.sweep_id, access.may_read, context)
        return control_pb2.GetSweepResponse(sweep=wire.sweep_status(sweep, self.c.cluster.trial_rows(sweep)))

    async def ListSweeps(self, request, context):
        who = security.caller()
        sweeps = sorted(self.c.cluster.sweeps.by_id.values(), key=lambda s: s.number)
        return control_pb2.ListSweepsResponse(sweeps=[wire.sweep_status(s) for s in sweeps if access.may_read(who, s)])

    async def StopSweep(self, request, context):
        sweep = await self._sweep(request.sweep_id, access.may_act, context)
        await self._acknowledged(self.c.apply(self.c.cluster.stop_sweep(sweep.id, self.c.clock())), context)
        log.info("%s stopped", sweep, extra=fields(job=sweep.id))
        return control_pb2.StopSweepResponse(state=sweep.state.value)

    async def _sweep(self, sweep_id: str, allowed, context) -> Sweep:
        """The sweep, once the caller may see it (or act on it); another's sweep is refused with its owner."""
        sweep = self.c.cluster.sweeps.by_id.get(sweep_id)
        if sweep is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown sweep {sweep_id[:200]!r}")
        if not allowed(security.caller(), sweep):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"sweep {sweep.id} belongs to {sweep.owner}" if sweep.owner else
                                f"sweep {sweep.id} belongs to no one: only an admin may act on it")
        return sweep
