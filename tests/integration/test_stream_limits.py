"""One user's streams do not stall anyone else. Each caller may hold --max-streams-per-caller calls that stay open
(following jobs or logs, on gRPC or the dashboard, sending code) over all its connections together; the next is
refused with RESOURCE_EXHAUSTED naming the limit and the flag, the first at once and the ones after it held and
answered at a bounded pace (so that a flood of refusals keeps the places of its connections taken instead of
cycling through them); a call's place is given back however it ends (finished, failed, cancelled by the client,
cut by the server's stop); and gRPC bounds the calls open on any one connection, the ones past it waiting in
the client. Tried the way bob would: thousands of WatchJob calls
with his own certificate against a real coordinator and two real agents, while alice's job runs and an admin
asks for the status."""

from __future__ import annotations

import asyncio
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from harness import LocalCluster, free_port, wait_until
from streamflood import StatusSampler, flood_streams, nodes_lost, write_pems
from tfcluster import security
from tfcluster.api.v1 import control_pb2, control_pb2_grpc
from tfcluster.client import Client
from tfcluster.credentials import Credentials
from tfcluster.daemon.coordinator.rpc.listener import STREAMS_PER_CONNECTION, Listener, Services
from tfcluster.daemon.coordinator.rpc.stream_limits import (DEFAULT_PER_CALLER, REFUSALS_PER_SECOND, RefusalPace,
                                                             StreamLimits)
from tfcluster.specfile import parse_spec

STREAMS, CONNECTIONS, FLOOD_SECONDS = 5000, 4, 4.0
REFUSAL = (f"user 'bob' already holds {DEFAULT_PER_CALLER} open streams (following jobs or logs, sending code), "
           f"the most one caller may (--max-streams-per-caller {DEFAULT_PER_CALLER}): end one and retry")
WATCH, UPLOAD, STATUS = (security.CONTROL + m for m in ("WatchJob", "UploadCode", "GetStatus"))


def credentials(pems: list[str]) -> Credentials:
    ca, cert, key = (Path(p).read_bytes() for p in pems)
    return Credentials(ca, cert, key)


def submit(cluster: LocalCluster, pems: list[str], name: str, workers: int, seconds: float) -> str:
    spec = parse_spec({"name": name, "strategy": "multi_worker_mirrored", "workdir": "/",
                       "command": ["sleep", str(seconds)], "roles": {"worker": {"count": workers}}}, source="test")
    with Client(cluster.address, credentials(pems)) as client:
        job_id = client.submit(spec)
        wait_until(lambda: all(t.state == "RUNNING" for t in client.job(job_id).tasks), 30, what=f"{name} to run")
    return job_id


def hold_watches(cluster: LocalCluster, pems: list[str], job_id: str, count: int) -> tuple[grpc.Channel, dict]:
    """count WatchJob calls on one connection: those that got the job's status are held open on the channel
    returned (close it to end them); the codes every call got, with the details of each refusal."""
    channel = credentials(pems).channel(cluster.address)
    stub = control_pb2_grpc.ControlServiceStub(channel)
    calls = [stub.WatchJob(control_pb2.WatchJobRequest(job_id=job_id), timeout=60) for _ in range(count)]
    ended: dict[str, list[str]] = {}
    for call in calls:
        try:
            next(call)
            ended.setdefault("OK", []).append("")
        except grpc.RpcError as e:
            ended.setdefault(e.code().name, []).append(e.details())
    return channel, ended


def fetch(cluster: LocalCluster, pems: list[str], path: str) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=pems[0])
    context.load_cert_chain(pems[1], pems[2])
    try:
        with urllib.request.urlopen(f"https://{cluster.http}{path}", context=context, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def cluster(tmp_path):
    cluster = LocalCluster(root=tmp_path)
    cluster.http = f"127.0.0.1:{free_port()}"
    try:
        cluster.start_coordinator("--http-listen", cluster.http)
        cluster.start_agents({"a": {}, "b": {}})
        yield cluster
    finally:
        cluster.teardown()


@pytest.mark.timeout(300)
def test_bobs_thousands_of_watches_are_refused_past_his_share_while_everyone_else_is_served(cluster):
    alice, bob = write_pems(cluster, "user", "alice"), write_pems(cluster, "user", "bob")
    bob_job = submit(cluster, bob, "bobs", 1, 300)
    alice_job = submit(cluster, alice, "alices", 2, FLOOD_SECONDS + 6)  # a task on each node, through the flood
    sampler = StatusSampler(cluster).warm_up()
    with sampler:
        flood = flood_streams(cluster, bob, bob_job, STREAMS, CONNECTIONS, FLOOD_SECONDS)
    sampler.close()
    codes, details = flood["codes"]["watch"], flood["details"]
    print(f"bob's calls: {codes} (all answered in {flood['all_answered_seconds']} s); status during the flood: "
          f"{len(sampler.latencies)} calls, slowest {max(sampler.latencies) * 1000:.0f} ms")

    # His share, over all his connections together; the rest refused, saying why, no faster than the pace: the
    # refusals held keep his connections' places taken. A call past the bound of one connection may be reset by
    # gRPC itself (REFUSED_STREAM) before the coordinator sees it.
    assert flood["held"] == codes["OK"] == DEFAULT_PER_CALLER, codes
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED", "UNAVAILABLE"}, (codes, details)
    assert codes["RESOURCE_EXHAUSTED"] + codes.get("UNAVAILABLE", 0) == STREAMS - DEFAULT_PER_CALLER, codes
    assert codes["RESOURCE_EXHAUSTED"] >= 0.5 * STREAMS, codes
    assert flood["all_answered_seconds"] >= 0.9 * codes["RESOURCE_EXHAUSTED"] / REFUSALS_PER_SECOND, flood
    assert details["watch RESOURCE_EXHAUSTED"] == REFUSAL
    assert "UNAVAILABLE" not in codes or "RST_STREAM" in details["watch UNAVAILABLE"], details

    # Everyone else: every status asked for during the flood answered, no node ever anything but READY, alice's
    # job through without a restart.
    assert len(sampler.latencies) >= FLOOD_SECONDS / sampler.interval / 2 and not sampler.failures, \
        (len(sampler.latencies), sampler.failures)
    assert not sampler.not_ready, sampler.not_ready
    assert nodes_lost(cluster) == 0
    assert [cluster.node_state(n) for n in ("a", "b")] == ["READY", "READY"]
    job = cluster.wait_job(alice_job, timeout=60)
    assert (job["state"], job["restarts"]) == ("SUCCEEDED", 0), job

    # His calls went with his client: he holds his whole share again, and no more, the dashboard's log view
    # counted with them; once he lets them go, the view is his again.
    held: list[grpc.Channel] = []

    tries: list[dict] = []

    def whole_share_again() -> bool:
        channel, ended = hold_watches(cluster, bob, bob_job, DEFAULT_PER_CALLER + 1)
        tries.append(ended)
        if len(ended.get("OK", [])) == DEFAULT_PER_CALLER and ended.get("RESOURCE_EXHAUSTED") == [REFUSAL]:
            held.append(channel)
            return True
        channel.close()  # a try that did not get exactly his share lets go of what it got, for the next try
        return False
    try:
        wait_until(whole_share_again, 30, interval=0.5, what="bob's calls to be given back")
    except AssertionError as e:
        raise AssertionError(f"{e}; the last tries: {tries[-3:]}") from None
    log_view = f"/api/jobs/{bob_job}/tasks/worker:0/log?tail=5"
    assert fetch(cluster, bob, log_view) == (429, REFUSAL + "\n")
    held[0].close()
    wait_until(lambda: fetch(cluster, bob, log_view)[0] == 200, 20, what="the log view once bob's calls ended")
    assert "Traceback" not in cluster.coordinator.log()


# ---- each call's place given back, however it ends; the bound per connection -------------------------------

async def watch(request: bytes, context):
    """A WatchJob stand-in: b"hold" answers once and stays open, b"end" answers once and ends, b"fail" fails."""
    if request == b"fail":
        await context.abort(grpc.StatusCode.INTERNAL, "failed on purpose")
    yield b"status"
    if request == b"hold":
        await asyncio.Event().wait()


async def upload(request_iterator, context):
    async for _ in request_iterator:
        pass
    return b"stored"


async def status(request: bytes, context):
    return b"ok"


class Served(grpc.GenericRpcHandler):
    HANDLERS = {WATCH: grpc.unary_stream_rpc_method_handler(watch),
                UPLOAD: grpc.stream_unary_rpc_method_handler(upload),
                STATUS: grpc.unary_unary_rpc_method_handler(status)}

    def service(self, details):
        return self.HANDLERS.get(details.method)


async def serving(limits: StreamLimits) -> Listener:
    """The coordinator's listener in plain text (callers counted by address) behind the guard and its count."""
    listener = Listener("127.0.0.1:0", None)
    services = Services()
    services.add_generic_rpc_handlers([Served()])
    listener.serve(services, [security.AsyncGuard(None, admit_long_lived=limits.admit)])
    await listener.server.start()
    return listener


async def held_after(limits: StreamLimits, expected: int) -> None:
    """Waits (a few seconds at most) until this caller's count is expected: the server learns of an end a moment
    after the client."""
    for _ in range(200):
        if limits.held.get("the address 127.0.0.1", 0) == expected:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"holds {limits.held}, expected {expected}")


def test_a_calls_place_is_given_back_however_it_ends():
    async def scenario():
        limits = StreamLimits(2)
        listener = await serving(limits)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{listener.port}") as channel:
            watch_call, upload_call = channel.unary_stream(WATCH), channel.stream_unary(UPLOAD)
            first, second = watch_call(b"hold"), watch_call(b"hold")
            assert [await first.read(), await second.read()] == [b"status", b"status"]
            await held_after(limits, 2)
            third = watch_call(b"hold")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await third.read()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refused.value.details() == ("the address 127.0.0.1 already holds 2 open streams (following jobs "
                                               "or logs, sending code), the most one caller may "
                                               "(--max-streams-per-caller 2): end one and retry")
            assert await channel.unary_unary(STATUS)(b"", timeout=5) == b"ok", "a short call is not counted"
            first.cancel()  # the client goes away
            await held_after(limits, 1)
            assert [m async for m in watch_call(b"end")] == [b"status"]  # it ends by itself
            await held_after(limits, 1)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await watch_call(b"fail").read()
            assert failed.value.code() == grpc.StatusCode.INTERNAL
            await held_after(limits, 1)
            assert await upload_call(iter([b"chunk", b"chunk"]), timeout=5) == b"stored"  # an upload is counted too
            await held_after(limits, 1)
            await listener.server.stop(0)  # the server stops under a held call
            await held_after(limits, 0)
        assert limits.held == {}
    asyncio.run(scenario())


def test_one_connection_carries_its_bound_of_calls_at_once_and_the_rest_wait_in_the_client():
    async def scenario():
        limits = StreamLimits(0)  # no bound per caller, only the connection's; the calls are still counted
        listener = await serving(limits)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{listener.port}")
        assert await channel.unary_unary(STATUS)(b"", timeout=5) == b"ok"  # the server's settings known
        watch_call = channel.unary_stream(WATCH)
        calls = [watch_call(b"hold") for _ in range(STREAMS_PER_CONNECTION + 50)]
        await held_after(limits, STREAMS_PER_CONNECTION)
        await asyncio.sleep(0.5)
        assert limits.held == {"the address 127.0.0.1": STREAMS_PER_CONNECTION}
        assert not any(call.done() for call in calls), "none refused: the rest wait in the client"
        await channel.close()  # the connection goes, and every call on it
        await held_after(limits, 0)
        await listener.server.stop(0)
    asyncio.run(scenario())


def test_refusals_past_the_share_come_back_paced_while_the_callers_other_calls_are_answered_at_once():
    async def scenario():
        limits = StreamLimits(1, RefusalPace(rate=4, most_held=2))
        listener = await serving(limits)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{listener.port}") as channel:
            watch_call = channel.unary_stream(WATCH)
            held = watch_call(b"hold")
            assert await held.read() == b"status"
            loop = asyncio.get_running_loop()
            started = loop.time()

            async def refused_after() -> float:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await watch_call(b"hold").read()
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                return loop.time() - started
            refusals = [asyncio.create_task(refused_after()) for _ in range(4)]
            await held_after(limits, 1)
            assert await channel.unary_unary(STATUS)(b"", timeout=5) == b"ok"
            status_done = loop.time() - started
            took = sorted(await asyncio.gather(*refusals))
            # Answered before the first refusal the pace held came back: the pace holds refusals, not the caller.
            assert status_done < took[2], ("a short call of the same caller is not held", status_done, took)
            # One at once, two held (a quarter of a second apart), and the one past the bound of two held at once.
            # The held ones come no sooner than the pace lets them; the bounds above are loose for a loaded machine.
            assert took[1] < took[2] and took[1] < 0.5, took
            assert 0.2 <= took[2] < 1.5 and 0.45 <= took[3] < 2.0, took
            assert limits.pace.held == {}
            held.cancel()
        await listener.server.stop(0)
    asyncio.run(scenario())
