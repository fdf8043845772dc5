"""The agent's judgement of its GPUs' NVML readings (node/gpu_health.py), pure: which readings make which condition,
which of them keep a GPU out of placement, what clears by itself and what stays until the agent restarts. The
readings come from a reader object, as NvmlReader gives them on a GPU node."""

from __future__ import annotations

import pytest

from tfcluster import conditions as kinds
from tfcluster.daemon.agent.node.gpu_health import GpuHealth, GpuReading, Unreadable, assess, findings

HEALTHY = GpuReading(ecc_volatile_uncorrected=0, ecc_aggregate_uncorrected=0, retired_pages_pending=False,
                     row_remap_pending=False, row_remap_failed=False, throttle_reasons=0)
CONSUMER = GpuReading()  # NOT_SUPPORTED everywhere: every reading None


class Readings:
    """A reader that gives the readings it is handed, one check at a time."""

    def __init__(self, *checks):
        self.checks = list(checks)

    def read(self):
        reading = self.checks.pop(0)
        if isinstance(reading, str):
            raise Unreadable(reading)
        return reading


def kinds_of(found):
    return [(c.gpu, c.kind, c.excludes) for c in found]


@pytest.mark.parametrize("reading", [HEALTHY, CONSUMER, GpuReading(throttle_reasons=0x01 | 0x04)])
def test_a_healthy_gpu_or_one_that_cannot_tell_has_no_condition(reading):
    # 0x01 (idle) and 0x04 (applications clocks setting) are not heat or power
    assert findings(reading) == []


@pytest.mark.parametrize("reading, kind, excludes", [
    (GpuReading(ecc_volatile_uncorrected=2, ecc_aggregate_uncorrected=7), kinds.ECC_UNCORRECTABLE, True),
    (GpuReading(retired_pages_pending=True), kinds.RETIRED_PAGES_PENDING, True),
    (GpuReading(row_remap_pending=True), kinds.ROW_REMAP_PENDING, True),
    (GpuReading(row_remap_failed=True), kinds.ROW_REMAP_FAILED, True),
    (GpuReading(xids=(79,)), kinds.XID, True),
    (GpuReading(xids=(31,)), kinds.APPLICATION_XID, False),
    (GpuReading(lost="GPU is lost"), kinds.GPU_LOST, True),
    (GpuReading(throttle_reasons=0x40), kinds.THROTTLED, False),
    (GpuReading(throttle_reasons=0x80), kinds.THROTTLED, False),
])
def test_each_problem_makes_its_condition_and_only_sick_gpus_are_excluded(reading, kind, excludes):
    [found] = assess({1: reading}, [], now=100.0)
    assert (found.gpu, found.kind, found.excludes, found.since) == (1, kind, excludes, 100.0)


def test_the_messages_say_what_was_read():
    [ecc] = assess({0: GpuReading(ecc_volatile_uncorrected=2, ecc_aggregate_uncorrected=7)}, [], 0.0)
    assert ecc.message == "uncorrectable ECC errors: 2 since the driver loaded, 7 in its life"
    assert ecc.words("b") == "GPU 0 of node b excluded: uncorrectable ECC errors: 2 since the driver loaded, 7 in its life"
    [xid] = assess({0: GpuReading(xids=(79, 48, 79))}, [], 0.0)
    assert xid.message == "Xid 48 (double-bit ECC error), 79 (GPU has fallen off the bus)"
    [hot] = assess({0: GpuReading(throttle_reasons=0x08 | 0x20)}, [], 0.0)
    assert hot.message == "clocks throttled: HW slowdown, SW thermal slowdown"
    assert hot.words("b") == "GPU 0 of node b: clocks throttled: HW slowdown, SW thermal slowdown"


def test_a_lost_gpu_says_only_that_it_is_lost():
    assert kinds_of(assess({2: GpuReading(lost="GPU is lost", throttle_reasons=0x40)}, [], 0.0)) == \
        [(2, kinds.GPU_LOST, True)]


def test_throttling_and_ecc_counts_clear_by_themselves_and_keep_their_since_while_they_hold():
    health = GpuHealth(Readings({0: GpuReading(throttle_reasons=0x40), 1: GpuReading(ecc_volatile_uncorrected=1)},
                                {0: GpuReading(throttle_reasons=0x40), 1: GpuReading(ecc_volatile_uncorrected=1)},
                                {0: HEALTHY, 1: HEALTHY}), clock=iter([10.0, 20.0, 30.0]).__next__)
    first = health.check()
    assert [(c.gpu, c.kind, c.since) for c in first] == [(0, kinds.THROTTLED, 10.0), (1, kinds.ECC_UNCORRECTABLE, 10.0)]
    assert [c.since for c in health.check()] == [10.0, 10.0], "found again: still since the first check"
    assert health.check() == (), "the throttling stopped and the GPU was reset: nothing holds"


def test_lost_gpus_pending_retirements_and_hardware_xids_stay_until_the_agent_restarts():
    sticky = {0: GpuReading(lost="GPU is lost"), 1: GpuReading(retired_pages_pending=True),
              2: GpuReading(xids=(48,)), 3: GpuReading(row_remap_pending=True)}
    health = GpuHealth(Readings(sticky, {i: HEALTHY for i in range(4)}), clock=iter([1.0, 2.0]).__next__)
    first = health.check()
    assert health.check() == first, "a reading that looks fine again does not lift them: a reset or reboot mends"
    restarted = GpuHealth(Readings({i: HEALTHY for i in range(4)}))
    assert restarted.check() == ()


def test_an_application_xid_lasts_until_a_check_without_one():
    health = GpuHealth(Readings({0: GpuReading(xids=(13,))}, {0: HEALTHY}), clock=iter([1.0, 2.0]).__next__)
    assert kinds_of(health.check()) == [(0, kinds.APPLICATION_XID, False)]
    assert health.check() == ()


def test_nvml_that_stops_answering_is_a_node_condition_that_keeps_what_the_gpus_had():
    health = GpuHealth(Readings({0: GpuReading(row_remap_failed=True)}, "Driver Not Loaded", {0: HEALTHY}),
                       clock=iter([1.0, 2.0, 3.0]).__next__)
    health.check()
    found = health.check()
    assert kinds_of(found) == [(None, kinds.NVML_UNAVAILABLE, False), (0, kinds.ROW_REMAP_FAILED, True)]
    assert found[0].message == "NVML does not answer: Driver Not Loaded"
    assert kinds_of(health.check()) == [(0, kinds.ROW_REMAP_FAILED, True)], "NVML back: the node condition clears"


def test_a_message_is_one_printable_line_of_bounded_length():
    [found] = assess({0: GpuReading(lost="lost\n" + "x" * 500)}, [], 0.0)
    assert "\n" not in found.message and len(found.message) == kinds.MAX_CONDITION_MESSAGE


def test_the_first_check_says_what_the_board_lets_nvml_tell(caplog):
    from tfcluster.daemon.agent.node.gpu_health import GpuHealth, GpuReading

    class Board:
        def read(self):
            return {0: GpuReading(ecc_volatile_uncorrected=0, ecc_aggregate_uncorrected=0, retired_pages_pending=None,
                                  row_remap_pending=False, row_remap_failed=False, throttle_reasons=1)}

    health = GpuHealth(Board(), clock=lambda: 100.0)
    with caplog.at_level("INFO"):
        health.check()
        health.check()
    firsts = [r.getMessage() for r in caplog.records if "first check" in r.getMessage()]
    assert firsts == ["GPU health: first check: GPU 0: Xid errors none, ECC uncorrected 0 (0 in its life), retired "
                      "pages pending n/a, row remap pending no, failed no, clock throttle reasons 0x1"]
