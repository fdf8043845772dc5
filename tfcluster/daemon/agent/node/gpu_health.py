"""The health of the node's GPUs: read through NVML (node/nvml_health.py) before the agent registers and every
--gpu-check-interval after, and judged here into conditions (tfcluster/conditions.py) the agent sends with its
registration and each heartbeat. The judgement is pure: readings in, conditions out.

Conditions that clear lift themselves at the next check (throttling stops, the volatile ECC count is reset with the
GPU). Those only a GPU reset or a reboot mends stay until the agent restarts: a GPU lost from the bus, pages or rows
waiting to be retired or remapped (they are, at the reset), a failed row remap, and a hardware Xid error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tfcluster import conditions as kinds
from tfcluster.conditions import MAX_CONDITION_MESSAGE, NodeCondition
from tfcluster.model import printable

log = logging.getLogger("tfcluster.agent")

DEFAULT_INTERVAL_SECONDS = 60.0
# Xid errors NVIDIA's documentation puts down to the program that ran (a bad kernel, a page fault of its own, its
# context torn down after one): shown, but the GPU stays in placement.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
XID_WORDS = {48: "double-bit ECC error", 61: "internal micro-controller breakpoint", 62: "internal micro-controller "
             "halt", 63: "ECC page retirement or row remapping", 64: "ECC page retirement or row remapping failure",
             74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
             94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP timeout", 120: "GSP error"}
# nvmlClocksThrottleReason* (NVML's clock event reasons) that mean heat or power slowed the clocks.
THROTTLE_REASONS = ((0x08, "HW slowdown"), (0x40, "HW thermal slowdown"), (0x80, "HW power brake slowdown"),
                    (0x20, "SW thermal slowdown"))
# Kept until the agent restarts once found: only a GPU reset or a reboot (which restarts the agent) mends them.
STICKY = frozenset({kinds.GPU_LOST, kinds.RETIRED_PAGES_PENDING, kinds.ROW_REMAP_PENDING, kinds.ROW_REMAP_FAILED,
                    kinds.XID})


@dataclass(frozen=True)
class GpuReading:
    """What NVML said of one GPU. None: NVML cannot tell on this GPU (NOT_SUPPORTED on consumer boards)."""
    lost: str = ""  # why the GPU does not answer at all; "": it answers
    xids: tuple[int, ...] = ()  # critical Xid errors since the last reading
    ecc_volatile_uncorrected: int | None = None  # since the driver loaded
    ecc_aggregate_uncorrected: int | None = None  # in the GPU's life
    retired_pages_pending: bool | None = None
    row_remap_pending: bool | None = None
    row_remap_failed: bool | None = None
    throttle_reasons: int | None = None  # the nvmlClocksThrottleReason* bits set now


class Unreadable(Exception):
    """NVML itself does not answer on this node (the driver went away): no GPU can be read."""


class Reader(Protocol):
    def read(self) -> dict[int, GpuReading]: ...  # GPU index -> its reading; raises Unreadable


def findings(reading: GpuReading) -> list[tuple[str, str]]:
    """(kind, message) for each problem one GPU's reading shows."""
    if reading.lost:
        return [(kinds.GPU_LOST, reading.lost)]
    found = []
    hardware = sorted({x for x in reading.xids if x not in APPLICATION_XIDS})
    if hardware:
        found.append((kinds.XID, "Xid " + ", ".join(f"{x}" + (f" ({XID_WORDS[x]})" if x in XID_WORDS else "")
                                                     for x in hardware)))
    own = sorted({x for x in reading.xids if x in APPLICATION_XIDS})
    if own:
        found.append((kinds.APPLICATION_XID, f"Xid {', '.join(map(str, own))} raised by a program's own fault"))
    if reading.ecc_volatile_uncorrected:
        life = f", {reading.ecc_aggregate_uncorrected} in its life" if reading.ecc_aggregate_uncorrected else ""
        found.append((kinds.ECC_UNCORRECTABLE, f"uncorrectable ECC errors: {reading.ecc_volatile_uncorrected} since "
                                               f"the driver loaded{life}"))
    if reading.retired_pages_pending:
        found.append((kinds.RETIRED_PAGES_PENDING, "retired memory pages pending: reset the GPU or reboot"))
    if reading.row_remap_pending:
        found.append((kinds.ROW_REMAP_PENDING, "memory row remapping pending: reset the GPU or reboot"))
    if reading.row_remap_failed:
        found.append((kinds.ROW_REMAP_FAILED, "memory row remapping failed: the GPU needs service"))
    slowed = [words for bit, words in THROTTLE_REASONS if (reading.throttle_reasons or 0) & bit]
    if slowed:
        found.append((kinds.THROTTLED, "clocks throttled: " + ", ".join(slowed)))
    return found


def assess(readings: Mapping[int, GpuReading], previous: Sequence[NodeCondition], now: float,
           unreadable: str = "") -> list[NodeCondition]:
    """The node's conditions now, from this check's readings and the last check's conditions: a condition found
    again keeps its `since`; a sticky one stays though not found again; unreadable: why NVML gave nothing (then
    every GPU's conditions stay as they were)."""
    before = {(c.gpu, c.kind): c for c in previous}
    now_found: dict[tuple[int | None, str], NodeCondition] = {}

    def found(gpu: int | None, kind: str, message: str) -> None:
        was = before.get((gpu, kind))
        now_found[(gpu, kind)] = NodeCondition(gpu, kind, _line(message), was.since if was else now)

    if unreadable:
        found(None, kinds.NVML_UNAVAILABLE, f"NVML does not answer: {unreadable}")
        now_found.update({(c.gpu, c.kind): c for c in previous if c.gpu is not None})
    for gpu in sorted(readings):
        for kind, message in findings(readings[gpu]):
            found(gpu, kind, message)
    for key, was in before.items():
        if key not in now_found and was.kind in STICKY:
            now_found[key] = was
    return sorted(now_found.values(), key=lambda c: (c.gpu if c.gpu is not None else -1, c.kind))


def describe(reading: GpuReading) -> str:
    """A reading in words: "ECC uncorrected 0 (0 in its life), retired pages pending no, ..."; "n/a" where the
    board cannot tell."""
    if reading.lost:
        return f"lost ({reading.lost})"

    def told(value) -> str:
        return "n/a" if value is None else ("yes" if value is True else "no" if value is False else str(value))

    throttle = "n/a" if reading.throttle_reasons is None else f"{reading.throttle_reasons:#x}"
    return (f"Xid errors {list(reading.xids) or 'none'}, ECC uncorrected {told(reading.ecc_volatile_uncorrected)} "
            f"({told(reading.ecc_aggregate_uncorrected)} in its life), retired pages pending "
            f"{told(reading.retired_pages_pending)}, row remap pending {told(reading.row_remap_pending)}, failed "
            f"{told(reading.row_remap_failed)}, clock throttle reasons {throttle}")


def _line(message: str) -> str:
    return printable(message)[:MAX_CONDITION_MESSAGE]


class GpuHealth:
    """Checks the GPUs through a reader and keeps the node's conditions (a tuple, replaced whole, so the session
    reads it without a lock)."""

    def __init__(self, reader: Reader, interval: float = DEFAULT_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.time):
        self.reader, self.interval, self.clock = reader, interval, clock
        self.conditions: tuple[NodeCondition, ...] = ()
        self.checked = 0  # checks made

    def check(self) -> tuple[NodeCondition, ...]:
        try:
            readings, unreadable = self.reader.read(), ""
        except Unreadable as e:
            readings, unreadable = {}, str(e)
        found = tuple(assess(readings, self.conditions, self.clock(), unreadable))
        if not self.checked:  # once: what this board lets NVML tell, for an operator reading the agent's log
            log.info("GPU health: first check: %s", "; ".join(f"GPU {i}: {describe(r)}" for i, r in readings.items())
                     or f"nothing read ({unreadable})")
        self._log_changes(found)
        self.conditions, self.checked = found, self.checked + 1
        return found

    def run(self, stopped: threading.Event) -> None:
        """Checks again every interval until stopped (the first check ran before registering)."""
        while not stopped.wait(self.interval):
            try:
                self.check()
            except Exception:  # a reading NVML answers in a way no one foresaw must not end the checks
                log.exception("GPU health check failed")

    def _log_changes(self, found: tuple[NodeCondition, ...]) -> None:
        old = {(c.gpu, c.kind) for c in self.conditions}
        new = {(c.gpu, c.kind) for c in found}
        for c in found:
            if (c.gpu, c.kind) not in old:
                log.warning("GPU health: %s: %s (%s)", _where(c), c.message,
                            "left out of placement" if c.excludes else "shown only")
        for c in self.conditions:
            if (c.gpu, c.kind) not in new:
                log.info("GPU health: %s: %s no longer holds", _where(c), c.kind)


def _where(condition: NodeCondition) -> str:
    return "the node" if condition.gpu is None else f"GPU {condition.gpu}"
