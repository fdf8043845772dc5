"""The GPU health readings from NVML (nvidia-ml-py) that node/gpu_health.py judges: Xid errors since the last
reading (an event set for critical Xid errors, drained without waiting), uncorrectable ECC counts, pages and rows
waiting to be retired or remapped, a GPU lost from the bus, and why its clocks are throttled. Every reading is
defended: one a board does not support (NOT_SUPPORTED on consumer GPUs) reads as None, not as a problem.
"""

from __future__ import annotations

import logging
import threading

from tfcluster.daemon.agent.node.gpu_health import GpuReading, Unreadable
from tfcluster.model import Gpu

log = logging.getLogger("tfcluster.agent")

MAX_EVENTS_PER_READ = 1024  # Xid events drained at one reading; a GPU spewing more is lost or failing anyway


class _Lost(Exception):
    """NVML_ERROR_GPU_IS_LOST on one GPU."""


class NvmlReader:
    """Reads the agent's GPUs (found by UUID, so a renumbering cannot mix them up). NVML is started once; a driver
    that does not load raises Unreadable at each reading."""

    def __init__(self, gpus: tuple[Gpu, ...]):
        self.gpus = gpus
        self.lock = threading.Lock()
        self.nvml = None
        self.events = None
        self.problem = ""
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
        except Exception as e:  # no library, no driver
            self.problem = str(e) or type(e).__name__
            return
        self.events = self._watch_xids()

    def read(self) -> dict[int, GpuReading]:
        if self.nvml is None:
            raise Unreadable(self.problem)
        with self.lock:
            xids = self._drain_xids()
            readings = {}
            for gpu in self.gpus:
                try:
                    readings[gpu.index] = self._read_one(gpu, tuple(xids.get(gpu.uuid, ())))
                except _Lost:
                    readings[gpu.index] = GpuReading(lost="GPU is lost: it no longer answers (fallen off the bus?)")
            return readings

    def _handle(self, gpu: Gpu):
        nvml = self.nvml
        try:
            if gpu.uuid:
                return nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            return nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        except nvml.NVMLError as e:
            raise _Lost() from e  # gone from the bus, or from NVML's list

    def _read_one(self, gpu: Gpu, xids: tuple[int, ...]) -> GpuReading:
        nvml = self.nvml
        handle = self._handle(gpu)
        remapped = self._optional(lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        return GpuReading(
            xids=xids,
            ecc_volatile_uncorrected=self._optional(lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)),
            ecc_aggregate_uncorrected=self._optional(lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_AGGREGATE_ECC)),
            retired_pages_pending=_flag(self._optional(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))),
            row_remap_pending=bool(remapped[2]) if remapped is not None else None,
            row_remap_failed=bool(remapped[3]) if remapped is not None else None,
            throttle_reasons=self._optional(lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))

    def _optional(self, read):
        """One reading, or None where the GPU cannot give it; raises _Lost when the GPU no longer answers."""
        nvml = self.nvml
        try:
            return read()
        except nvml.NVMLError as e:
            if e.value == nvml.NVML_ERROR_GPU_IS_LOST:
                raise _Lost() from e
            if e.value not in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                log.debug("NVML reading failed: %s", e)
            return None

    def _watch_xids(self):
        """An event set every GPU that can registers its critical Xid errors with; None when none can."""
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as e:
            log.info("Xid errors are not watched: NVML cannot make an event set (%s)", e)
            return None
        for gpu in self.gpus:
            try:
                nvml.nvmlDeviceRegisterEvents(self._handle(gpu), nvml.nvmlEventTypeXidCriticalError, events)
            except (nvml.NVMLError, _Lost) as e:
                log.info("Xid errors of GPU %d are not watched: %s", gpu.index, e or "it does not answer")
        return events

    def _drain_xids(self) -> dict[str, list[int]]:
        """GPU UUID -> the Xid errors waiting in the event set (taken without waiting)."""
        nvml, found = self.nvml, {}
        if self.events is None:
            return found
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                event = nvml.nvmlEventSetWait_v2(self.events, 0)
            except nvml.NVMLError:  # NVML_ERROR_TIMEOUT: none left (or the set broke: nothing more to read)
                break
            if event.eventType & nvml.nvmlEventTypeXidCriticalError:
                try:
                    uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
                except nvml.NVMLError:
                    continue
                found.setdefault(uuid, []).append(int(event.eventData))
        return found


def _flag(value: int | None) -> bool | None:
    return None if value is None else value != 0


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
