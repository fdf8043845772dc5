"""A fleet of fake agents: many per process, each with its own connection, speaking the real wire API.

Each fake agent registers (retrying with backoff and jitter, like the real one), keeps one Connect stream,
heartbeats at the interval the coordinator asks for, lists its running tasks in each heartbeat, answers a
launch with RUNNING at once and a stop with an exit. It runs nothing. Used by the scale test, bench/scale.py
and bench/failover.py; run as a process:

    python tests/fleet.py COORDINATOR[,COORDINATOR...] FIRST COUNT [--exit-after S] [--ca-dir DIR]

Given several coordinators, each fake agent follows the leader as the real agent does (tfcluster.leaders): when
its stream is lost or a standby refuses it, it goes to the leader the standby named, else to the next address.
Given several, it also watches every other coordinator for the moment the one serving its stream no longer leads, as
the real agent does (tfcluster/daemon/agent/session/pulse.py), and leaves it once a standby names another leader. As the real
agent, it keeps one channel to each coordinator for its session and its pulse alike: when a standby wins, the
agent registers with it over the connection it has.

With --ca-dir (a cluster CA made by `tfcluster ca init`), each fake agent connects over mutual TLS with a
certificate naming its node, signed here with the CA's key as the join port would have signed it (one key for
the whole fleet: making 5,000 keys would measure key generation, not the coordinator).

It prints one JSON object per line on stdout: {"registered": n} as agents register (for the first time),
{"registered_with": {address: n}} when it changes (how many agents' last registration was with each coordinator,
looked at every 0.1 s), {"launch": [job, task, node, unix time]} for every launch received, and
{"heartbeats": total, "watches_held": n, "at": its monotonic time} every second (watches_held: the pulse's watches
a standby holds open, at most one per agent per other coordinator; a cluster is steady once all are held).

With --timeline FILE it also writes a line to FILE for each registration call sent, each registration, and each
failed call, and the end of each search for a new leader (tab-separated: wall-clock time, node, register |
registered | refused | failed | stalled | found, the coordinator's address, and the leader a refusal or the search
named or the failed call's status code): bench/failover.py reads them to show where the time after a failover goes.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import asyncio
import gc
import json
import random
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tfcluster import grpc_settings  # noqa: E402

grpc_settings.apply()  # as every tfcluster process: before gRPC is imported (no line per connection that ends)
import grpc  # noqa: E402

from tfcluster import __version__, pki, wire  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc  # noqa: E402
from tfcluster.commands import Launch, SetPace, Stop  # noqa: E402
from tfcluster.daemon.agent.session.new_leader import SEARCH_SECONDS, STILL_NAMED_SECONDS  # noqa: E402
from tfcluster.daemon.agent.session.pulse import PULSE_SECONDS, PULSE_TIMEOUT_SECONDS  # noqa: E402
from tfcluster.daemon.agent.session.session import REST_FIRST_SECONDS, REST_SECONDS  # noqa: E402
from tfcluster.daemon.coordinator.process import YOUNG_OBJECTS_PER_COLLECTION, freeze_survivors  # noqa: E402
from tfcluster.leaders import Coordinators, is_standby, leader_hint, leads_elsewhere, says_of, unreachable  # noqa: E402
from tfcluster.model import Attempt, Gpu, NodeInfo, Phase, TaskExit, TaskProgress, TaskReport  # noqa: E402

GPUS_PER_NODE = 8
# As the real agent: the transport retries a lost connection as often as the agent retries its session.
RECONNECT = [("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 2000)]


AIO_BROKEN_WRITE = "Internal error from Core"  # grpc.aio's details of a stream whose write failed (connection_lost)


def node_info(index: int) -> NodeInfo:
    """Node `fleet-<index>`: 8 GPUs, an address of its own in 10.0.0.0/8 (never dialled: tasks are fake)."""
    name = f"fleet-{index:05d}"
    address = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
    return NodeInfo(name=name, address=address, port_range=(20001, 20999), peer_port=20000,
                    gpus=tuple(Gpu(i, uuid=f"GPU-{name}-{i}", name="Fake GPU", memory_mib=81920)
                               for i in range(GPUS_PER_NODE)),
                    hostname=name, cpu_count=64, memory_bytes=512 << 30, agent_version=__version__,
                    state_dir=f"/var/lib/tfcluster/{name}")


class IdleOwner:
    """What a real agent's session (tfcluster/daemon/agent/session/session.py) asks of its agent, for a node that
    runs nothing and has nothing to say: tests give the session one, changing what they test."""

    def __init__(self, credentials):
        self.credentials = credentials

    def node_info(self) -> NodeInfo:
        return node_info(1)

    def task_reports(self):
        return []

    def progress(self):
        return []

    def condition(self):
        return ""

    def health(self):
        return ""

    def conditions(self):
        return ()

    def on_register(self):
        pass

    def handle(self, message):
        pass


class Stalled(Exception):
    """The coordinator serving the stream no longer leads (paused, cut off, or a standby won): args[0], the answer
    that told (a standby's names the leader)."""


@dataclass
class Registration:
    address: str = ""  # the coordinator the agent last registered with
    this_try: bool = False  # the current try registered: its failure is the first in a row


class Stats:
    def __init__(self, timeline: TextIO | None = None) -> None:
        self.timeline = timeline  # --timeline: every agent's registrations and failed calls, a line each
        self.registered = 0
        self.heartbeats = 0
        self.watches_held = 0  # watches a standby holds open for the agents' pulses
        self.errors: dict[str, int] = {}
        self.registered_with: dict[str, int] = {}  # coordinator address -> agents whose last registration was there

    def moved(self, old: str, new: str) -> None:
        """An agent registered with the coordinator at new, having last registered with the one at old ("": none)."""
        if old:
            self.registered_with[old] -= 1
        self.registered_with[new] = self.registered_with.get(new, 0) + 1

    def event(self, node: str, what: str, address: str, detail: str = "") -> None:
        """A line of the timeline: wall-clock time, node, what happened (register: the call is sent; registered;
        refused: a standby named the leader in detail; failed: the call's status code in detail), coordinator."""
        if self.timeline is not None:
            self.timeline.write(f"{time.time():.3f}\t{node}\t{what}\t{address}\t{detail}\n")


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


class FleetCredentials:
    """A certificate per fake node, for one shared key."""

    def __init__(self, ca_dir: Path):
        self.ca = pki.Authority.load(ca_dir, with_key=True)
        self.key = pki.new_key()
        self.certificates: dict[str, bytes] = {}  # signed once per node: a reconnection to another coordinator reuses it

    def channel(self, address: str, node: str, options: list) -> grpc.aio.Channel:
        if node not in self.certificates:
            self.certificates[node] = pki.cert_pem(self.ca.sign(self.key.public_key(), node, pki.NODE,
                                                                datetime.timedelta(hours=12)))
        creds = grpc.ssl_channel_credentials(self.ca.pem, pki.key_pem(self.key), self.certificates[node])
        return grpc.aio.secure_channel(address, creds, options=options)


async def fake_agent(addresses: str, index: int, stats: Stats, exit_after: float,
                     credentials: FleetCredentials | None) -> None:
    info = node_info(index)
    coordinators = Coordinators(addresses)
    options = [("grpc.use_local_subchannel_pool", 1), *RECONNECT]
    running: dict[Attempt, float] = {}  # attempt -> when it "exits" by itself
    backoff = 0.5
    last = Registration()
    failures = 0  # failed tries in a row since a registration
    channels = KeptChannels(lambda address: credentials.channel(address, info.name, options) if credentials else
                            grpc.aio.insecure_channel(address, options=options))
    pulse = Pulse(coordinators, channels, stats) if coordinators.several else None
    while True:
        address = coordinators.current
        last.this_try = False
        try:
            await _session(channels.get(address), address, info, running, stats, exit_after, last, pulse)
            backoff = 0.5
        except Stalled as stalled:  # as the real agent: the leader a standby named (else the next) at once
            stats.errors["STALLED"] = stats.errors.get("STALLED", 0) + 1
            stats.event(info.name, "stalled", address, leader_hint(stalled.args[0]))
            coordinators.failed(stalled.args[0])
            pulse.drop_kept()
            backoff = 0.5
        except grpc.RpcError as e:
            stats.errors[e.code().name] = stats.errors.get(e.code().name, 0) + 1
            stats.event(info.name, "refused" if leader_hint(e) else "failed", address, leader_hint(e) or e.code().name)
            lost = connection_lost(e)
            if lost and coordinators.several:
                channels.rest(address)
            # As the real agent (tfcluster/daemon/agent/session/session.py): a coordinator it could not reach, at the
            # first failure, sends it to the leader the others name; else a lost stream or a standby's refusal moves
            # it to the leader named or the next coordinator, with the backoff started again; the leader a standby
            # named at the first failure is asked at once.
            failures = 1 if last.this_try else failures + 1
            if lost and pulse is not None and failures == 1:
                leader = await pulse.find_leader(address)
                stats.event(info.name, "found", address, leader)
                if leader:
                    coordinators.follow(leader)
                    backoff = 0.5
                    continue
            if pulse is not None:
                pulse.drop_kept()  # no search: the watches the stream's pulse held are not needed
            if (lost or e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)) and \
                    coordinators.failed(e):
                backoff = 0.5
                if leader_hint(e) and failures == 1:
                    continue
            await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
            backoff = min(backoff * 2, 2.0)


def status(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """An answer no call gave (a watch that ended without a word, one still naming the coordinator left), as calls'
    answers are read: a watch's answer is None (it serves) or an error."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def connection_lost(e: grpc.RpcError) -> bool:
    """Whether the agent's call ended because its coordinator could not be reached (leaders.unreachable) or, as grpc.aio
    says it, because the connection broke while the fake agent wrote on its stream: INTERNAL "Internal error from Core"
    (the real agent's synchronous stack reads UNAVAILABLE there). About 3 in 100 fake agents read that when a leader is
    killed, and took the path of a refused agent instead of searching for the new leader."""
    return unreachable(e) or (e.code() == grpc.StatusCode.INTERNAL and e.details() == AIO_BROKEN_WRITE)


class KeptChannels:
    """As the real agent's (tfcluster/daemon/agent/session/session.py, Channels): one channel kept per coordinator;
    one that could not be reached rests, its channel closed, and takes a TCP connection before it is watched again."""

    def __init__(self, make) -> None:
        self.make = make  # address -> a new channel
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.resting_until: dict[str, float] = {}
        self.failed_tries: dict[str, int] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        if address not in self.channels:
            self.channels[address] = self.make(address)
        return self.channels[address]

    def rest(self, address: str) -> None:
        tries = self.failed_tries[address] = self.failed_tries.get(address, 0) + 1
        rest = min(REST_SECONDS, REST_FIRST_SECONDS * 2 ** min(tries - 1, 16)) * random.uniform(0.5, 1.5)
        self.resting_until[address] = time.monotonic() + rest
        if address in self.channels:
            asyncio.ensure_future(self.channels.pop(address).close())

    def rest_left(self, address: str) -> float:
        return max(0.0, self.resting_until.get(address, 0.0) - time.monotonic())

    async def reachable(self, address: str, timeout: float) -> bool:
        if address not in self.resting_until:
            return True
        host, _, port = address.rpartition(":")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout)
            writer.close()
        except (OSError, ValueError, asyncio.TimeoutError):
            self.rest(address)
            return False
        del self.resting_until[address]
        return True

    def reached(self, address: str) -> None:
        self.failed_tries.pop(address, None)


class Pulse:
    """As the real agent's (tfcluster/daemon/agent/session/pulse.py): watches every other coordinator at once, over
    channels kept open, for the moment the one serving the stream no longer leads; asks the others when a watch ends
    without telling, and that one itself only when none can."""

    def __init__(self, coordinators: Coordinators, channels: KeptChannels, stats: Stats) -> None:
        self.coordinators, self.channels = coordinators, channels
        self.stats = stats
        self.left = ""  # the coordinator last left because it no longer led
        # The watches held when the stream ended, by address: kept for the search (new_leader.py), which reads their
        # answers instead of cancelling them and opening the same watch again; cancelled by the next stream's pulse.
        self.kept: dict[str, asyncio.Task] = {}

    async def until_stalled(self, channel, call, interval: list[float]) -> grpc.RpcError | None:
        """Cancels the stream's call and returns the answer that said its coordinator no longer leads."""
        self.drop_kept()
        current = self.coordinators.current
        others = [a for a in self.coordinators.addresses if a != current]
        answers: asyncio.Queue = asyncio.Queue()
        held: dict[str, asyncio.Task] = {}  # as the real agent's: coordinators holding a watch, standbys naming current
        watching = [asyncio.create_task(self._keep_watching(a, current, answers, interval, held)) for a in others]
        try:
            while True:
                address, answer = await answers.get()
                verdict = self._says(current, answer)
                if verdict is None and set(held) - {address}:
                    verdict = True
                if verdict is None:
                    verdict = await self._ask_around(channel, current, others, address, answer)
                if not verdict:
                    call.cancel()
                    self.left = current
                    return answer
        finally:
            for task in watching:
                task.cancel()
            self.kept = dict(held)

    def drop_kept(self) -> None:
        for watch in self.kept.values():
            watch.cancel()
        self.kept = {}

    async def _keep_watching(self, address: str, current: str, answers: asyncio.Queue, interval: list[float],
                             held: dict[str, asyncio.Task]):
        await asyncio.sleep(random.uniform(0, max(PULSE_SECONDS, interval[0])))  # agents do not start in step
        while True:
            await asyncio.sleep(self.channels.rest_left(address))
            if not await self.channels.reachable(address, PULSE_TIMEOUT_SECONDS):
                continue
            opened = time.monotonic()
            watch = asyncio.create_task(self._watch(address, current, held))
            try:
                answer = await asyncio.shield(watch)  # a held watch outlives the stream's pulse (kept)
            except asyncio.CancelledError:
                if held.get(address) is not watch:
                    watch.cancel()
                raise
            if unreachable(answer):
                self.channels.rest(address)
            else:
                self.channels.reached(address)
            await answers.put((address, answer))
            await asyncio.sleep(max(0.0, max(PULSE_SECONDS, interval[0]) - (time.monotonic() - opened)))

    async def _watch(self, address: str, current: str, held: dict[str, asyncio.Task]) -> grpc.RpcError | None:
        call = health_pb2_grpc.HealthStub(self.channels.get(address)).Watch(
            health_pb2.HealthCheckRequest(service=current))
        try:
            await call.initial_metadata()
            if not call.done():
                held[address] = asyncio.current_task()
                self.stats.watches_held += 1
            async for _ in call:
                return None  # it serves
            return status(grpc.StatusCode.OK, "ended without a word")
        except grpc.RpcError as e:
            return e
        finally:
            if held.get(address) is asyncio.current_task():
                del held[address]
                self.stats.watches_held -= 1
            call.cancel()

    async def find_leader(self, left: str) -> str:
        """As the real agent's (tfcluster/daemon/agent/session/new_leader.py): the coordinator at left could not be
        reached; every other one is watched at once, and the first leader one names (or one that leads) is returned."""
        asked = [a for a in self.coordinators.addresses if a != left and not self.channels.rest_left(a)]
        kept, self.kept = self.kept, {}
        searches = [asyncio.create_task(self._named_by(a, left, kept.pop(a, None))) for a in asked]
        try:
            for search in asyncio.as_completed(searches, timeout=SEARCH_SECONDS):
                leader = await search
                if leader:
                    return leader
        except asyncio.TimeoutError:
            pass
        finally:
            for search in searches:
                search.cancel()
            for watch in kept.values():
                watch.cancel()
        return ""

    async def _named_by(self, address: str, left: str, kept: asyncio.Task | None) -> str:
        service, asked_since = left, time.monotonic()
        while True:
            until = asked_since + (SEARCH_SECONDS if not service else STILL_NAMED_SECONDS)
            if kept is not None:  # the pulse's watch, naming left: its answer, not a new one's
                answer, kept = await self._answer_of(kept, until - time.monotonic()), None
            elif time.monotonic() >= until or not await self.channels.reachable(address, PULSE_TIMEOUT_SECONDS):
                return ""
            else:
                answer = await self._watch_once(self.channels.get(address), service, until - time.monotonic())
            if answer is None:
                return address
            if unreachable(answer):
                self.channels.rest(address)
                return ""
            self.channels.reached(address)
            named = leader_hint(answer)
            if named and (named != left or not service):
                return named
            if is_standby(answer) and not named:
                service = ""
            elif answer.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return ""
            else:
                await asyncio.sleep(PULSE_SECONDS)

    @staticmethod
    async def _answer_of(watch: asyncio.Task, timeout: float) -> grpc.RpcError | None:
        try:
            return await asyncio.wait_for(watch, timeout)
        except asyncio.TimeoutError:
            return status(grpc.StatusCode.DEADLINE_EXCEEDED, "still named")

    @staticmethod
    async def _watch_once(channel, service: str, timeout: float) -> grpc.RpcError | None:
        request = health_pb2.HealthCheckRequest(service=service)
        call = health_pb2_grpc.HealthStub(channel).Watch(request, timeout=timeout)
        try:
            async for _ in call:
                return None
            return status(grpc.StatusCode.OK, "ended without a word")
        except grpc.RpcError as e:
            return e
        finally:
            call.cancel()

    def _says(self, current: str, answer) -> bool | None:
        verdict = says_of(current, answer)  # but old news from a standby that has not read the leader key since:
        return None if verdict is False and leader_hint(answer) == self.left else verdict

    async def _ask_around(self, channel, current: str, others: list[str], watched: str, answer) -> bool:
        answers = [answer]
        for address in others:
            if address != watched and not self.channels.rest_left(address) and \
                    await self.channels.reachable(address, PULSE_TIMEOUT_SECONDS):
                answers.append(await self._check(self.channels.get(address)))
                if unreachable(answers[-1]):
                    self.channels.rest(address)
                verdict = self._says(current, answers[-1])
                if verdict is not None:
                    return verdict
        if not leads_elsewhere(current, answers):
            return True
        own = await self._check(channel)
        return own is None or own.code() != grpc.StatusCode.DEADLINE_EXCEEDED

    @staticmethod
    async def _check(channel) -> grpc.RpcError | None:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=PULSE_TIMEOUT_SECONDS)
            return None
        except grpc.RpcError as e:
            return e


async def _session(channel, address: str, info: NodeInfo, running: dict, stats: Stats, exit_after: float,
                   last: Registration, pulse: Pulse | None) -> None:
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    tasks = [wire.task_report_to_proto(TaskReport(a, Phase.RUNNING, pid=1)) for a in running]
    stats.event(info.name, "register", address)
    reply = await stub.Register(agent_pb2.RegisterRequest(node=wire.node_info_to_proto(info), tasks=tasks),
                                timeout=10)
    if not last.address:
        stats.registered += 1
    if last.address != address:
        stats.moved(last.address, address)
        last.address = address
    last.this_try = True
    stats.event(info.name, "registered", address)
    call = stub.Connect()
    lock = asyncio.Lock()  # one write at a time on the stream

    async def send(message) -> None:
        async with lock:
            await call.write(message)

    await send(agent_pb2.AgentMessage(open=agent_pb2.StreamOpen(node_name=info.name, session_id=reply.session_id)))

    interval = [reply.heartbeat_interval_seconds]  # as a later Pace may change it

    async def beat() -> None:
        await asyncio.sleep(random.uniform(0, interval[0]))  # agents do not start in step
        while True:
            now = time.time()
            for attempt in [a for a, until in running.items() if until <= now]:
                del running[attempt]
                await send(agent_pb2.AgentMessage(task=wire.task_report_to_proto(
                    TaskReport(attempt, Phase.EXITED, exit=TaskExit(exit_code=0)))))
            await send(wire.heartbeat_to_proto(reply.session_id, [TaskProgress(a) for a in running]))
            stats.heartbeats += 1
            await asyncio.sleep(interval[0])

    beating = asyncio.create_task(beat())
    pulsing = asyncio.create_task(pulse.until_stalled(channel, call, interval)) if pulse else None
    try:
        async for message in call:
            command = wire.command_from_proto(message, info.name)
            if isinstance(command, Launch) and command.attempt not in running:
                emit(launch=[command.attempt.job_id, command.attempt.task_key, info.name, time.time()])
                running[command.attempt] = time.time() + exit_after
                await send(agent_pb2.AgentMessage(task=wire.task_report_to_proto(
                    TaskReport(command.attempt, Phase.RUNNING, pid=1))))
            elif isinstance(command, SetPace):
                interval[0] = command.heartbeat_interval_seconds
            elif isinstance(command, Stop) and command.attempt in running:
                del running[command.attempt]
                await send(agent_pb2.AgentMessage(task=wire.task_report_to_proto(
                    TaskReport(command.attempt, Phase.EXITED, exit=TaskExit(signal=15)))))
    except (asyncio.CancelledError, grpc.RpcError):  # how a call cancelled by the pulse ends
        if pulsing is None or not pulsing.done():
            raise
    finally:
        beating.cancel()
        if pulsing is not None:
            pulsing.cancel()
    if pulsing is not None and pulsing.done() and not pulsing.cancelled():
        raise Stalled(pulsing.result())


async def main(address: str, first: int, count: int, exit_after: float, ca_dir: Path | None,
               timeline: TextIO | None) -> None:
    stats = Stats(timeline)
    credentials = FleetCredentials(ca_dir) if ca_dir else None
    agents = [asyncio.create_task(fake_agent(address, first + i, stats, exit_after, credentials))
              for i in range(count)]
    registered, registered_with = -1, {}
    ticks = 0
    while True:
        await asyncio.sleep(0.1)
        if stats.registered_with != registered_with:
            registered_with = dict(stats.registered_with)
            emit(registered_with={a: n for a, n in registered_with.items() if n})
        ticks += 1
        if ticks % 10:
            continue
        if stats.registered != registered:
            registered = stats.registered
            emit(registered=registered)
        emit(heartbeats=stats.heartbeats, watches_held=stats.watches_held, errors=stats.errors, at=time.monotonic())
        if all(a.done() for a in agents):
            return


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("coordinator", help="HOST:PORT, or several comma-separated: the leader among them is followed")
    parser.add_argument("first", type=int)
    parser.add_argument("count", type=int)
    parser.add_argument("--exit-after", type=float, default=1.0, help="seconds a launched task 'runs'")
    parser.add_argument("--ca-dir", type=Path, help="the cluster CA: connect over mutual TLS")
    parser.add_argument("--timeline", type=Path, help="a file to write each agent's registrations and failed calls to")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # As the coordinator (daemon/coordinator/process.py): what outlives a full collection is frozen, so the
    # collector does not rescan hundreds of agents' channels and calls on every one, and the young generation is
    # collected far less often: at a failover each process's 500 agents make and drop calls, tasks and messages by
    # the hundred thousand, nearly all freed by their reference counts. With Python's default, `perf` found 15% of
    # the fake agents' CPU in the collector in the 14 s after a leader's kill at 5,000 agents; with this, 3%
    # (docs/ha.md).
    gc.callbacks.append(freeze_survivors)
    gc.set_threshold(YOUNG_OBJECTS_PER_COLLECTION, *gc.get_threshold()[1:])
    try:
        with open(args.timeline, "a", buffering=1) if args.timeline else contextlib.nullcontext() as timeline:
            asyncio.run(main(args.coordinator, args.first, args.count, args.exit_after, args.ca_dir, timeline))
    except KeyboardInterrupt:
        pass
