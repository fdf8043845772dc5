"""Each caller's open calls, counted (coordinator/rpc/stream_limits.py): a share per caller, the next refused naming the
limit and its flag, each place given back once however often its release runs, and every streaming call a
person's certificate may make among the counted ones."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tfcluster import security
from tfcluster.api.v1 import agent_pb2, control_pb2
from tfcluster.daemon.coordinator.rpc.stream_limits import RefusalPace, StreamLimits, TooManyStreams, caller_name
from tfcluster.pki import ADMIN, USER, VIEWER, Identity

PEOPLE = {ADMIN, USER, VIEWER}


def test_every_streaming_call_a_person_may_make_is_counted_and_no_agent_call_is():
    streaming = {f"/{service.full_name}/{method.name}"
                 for module in (agent_pb2, control_pb2) for service in module.DESCRIPTOR.services_by_name.values()
                 for method in service.methods if method.client_streaming or method.server_streaming}
    by_people = {m for m in streaming if security.POLICY[m].roles & PEOPLE}
    assert by_people == security.LONG_LIVED
    assert security.AGENT + "Connect" in streaming and security.AGENT + "Connect" not in security.LONG_LIVED


def test_a_caller_holds_its_share_and_the_next_is_refused_naming_the_limit_and_the_flag():
    limits = StreamLimits(2)
    bob, alice = caller_name(Identity(USER, "bob"), ""), caller_name(Identity(USER, "alice"), "")
    releases = [limits.enter(bob), limits.enter(bob)]
    with pytest.raises(TooManyStreams) as refused:
        limits.enter(bob)
    assert str(refused.value) == ("user 'bob' already holds 2 open streams (following jobs or logs, sending code), "
                                  "the most one caller may (--max-streams-per-caller 2): end one and retry")
    limits.enter(alice)  # another caller has a share of its own
    assert limits.held == {bob: 2, alice: 1}
    releases[0]("the call's context", "any argument")
    releases[0]()  # a second release of the same call gives nothing more back
    assert limits.held == {bob: 1, alice: 1}
    limits.enter(bob)
    with pytest.raises(TooManyStreams):
        limits.enter(bob)


def test_a_caller_with_nothing_open_is_forgotten():
    limits = StreamLimits()
    release = limits.enter("user 'bob'")
    release()
    assert limits.held == {}


def test_no_bound_still_counts_and_a_negative_one_is_a_mistake():
    limits = StreamLimits(0)
    for _ in range(1000):
        limits.enter("user 'bob'")
    assert limits.held == {"user 'bob'": 1000}
    with pytest.raises(ValueError, match="--max-streams-per-caller: expected 0 or more, got -1"):
        StreamLimits(-1)


def test_a_caller_without_a_certificate_is_counted_by_its_address():
    assert caller_name(None, "10.0.0.7") == "the address 10.0.0.7"
    assert caller_name(Identity(VIEWER, "grafana"), "10.0.0.7") == "viewer 'grafana'"


class Details:
    def __init__(self, method: str):
        self.method = method


async def served_by(behaviour):
    return grpc.unary_stream_rpc_method_handler(behaviour)


class Context:
    """What the guard reads and sets on a call without TLS."""

    def __init__(self):
        self.code = self.details = None

    def auth_context(self):
        return {}

    def peer(self):
        return "ipv4:10.0.0.7:41000"

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details


def test_the_guard_counts_only_the_long_lived_calls_after_its_own_admit():
    seen = []

    def admit(context):
        seen.append("admit")

    def admit_long_lived(context):
        seen.append("long-lived")
        raise security.Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "no more")

    async def behaviour(request, context):
        seen.append("handler")
        yield b""

    async def call(method: str) -> Context:
        guard = security.AsyncGuard(None, admit=admit, admit_long_lived=admit_long_lived)
        handler = await guard.intercept_service(lambda details: served_by(behaviour), Details(method))
        context = Context()
        async for _ in handler.unary_stream(b"", context):
            pass
        return context

    refused = asyncio.run(call(security.CONTROL + "WatchJob"))
    assert seen == ["admit", "long-lived"] and refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    seen.clear()
    served = asyncio.run(call(security.AGENT + "FetchCode"))
    assert seen == ["admit", "handler"] and served.code is None


def test_a_callers_refusals_come_back_one_at_once_then_paced_and_no_more_are_held_than_the_bound():
    pace = StreamLimits(1, RefusalPace(rate=10, most_held=3)).pace
    bob, alice = caller_name(Identity(USER, "bob"), ""), caller_name(Identity(USER, "alice"), "")
    assert pace.hold(bob, 100.0) == 0.0  # someone past the share by one learns it at once
    assert [pace.hold(bob, 100.0) for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])  # the rest, 10 a second
    assert pace.hold(bob, 100.0) == 0.0, "past the bound of held refusals: answered at once"
    assert pace.held == {bob: 3}
    assert pace.hold(alice, 100.0) == 0.0, "another caller's first refusal is not held behind bob's"
    pace.release(bob)
    assert pace.hold(bob, 100.05) == pytest.approx(0.35), "the pace stays: nothing answered before its turn"
    for _ in range(3):
        pace.release(bob)
    assert pace.held == {}
    assert pace.hold(bob, 101.0) == 0.0, "once the pace has caught up, the next refusal is answered at once"
    assert pace.hold(bob, 101.0) == pytest.approx(0.1)


def test_a_held_refusal_is_answered_after_its_hold_and_gives_its_place_back_even_when_cancelled():
    limits = StreamLimits(1, RefusalPace(rate=20, most_held=10))

    class Call:
        def peer(self) -> str:
            return "ipv4:10.0.0.9:4242"

        def add_done_callback(self, release) -> None:
            pass

    async def scenario():
        limits.admit(Call())  # the share of one, taken
        for held in (False, True):  # the first refusal at once, the next held
            with pytest.raises(security.Refused) as refused:
                limits.admit(Call())
            assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (refused.value.delay is not None) == held
        started = asyncio.get_running_loop().time()
        await refused.value.delay()
        assert asyncio.get_running_loop().time() - started >= 0.04
        assert limits.pace.held == {}
        with pytest.raises(security.Refused) as refused:
            limits.admit(Call())
        waiting = asyncio.create_task(refused.value.delay())
        await asyncio.sleep(0)
        assert limits.pace.held == {"the address 10.0.0.9": 1}
        waiting.cancel()  # the client went away while its refusal was held
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert limits.pace.held == {}
    asyncio.run(scenario())
