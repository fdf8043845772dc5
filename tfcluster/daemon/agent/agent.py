"""The agent process: a session with the coordinator (session.py), a supervisor that runs each task attempt
under its own shim (supervisor.py), and the per-task features as hooks on each attempt's life (hooks/api.py),
listed once in Agent.hooks. It also serves the node's peer port (checkpoints from other agents), its logs
and /metrics, renews the node's certificate, and keeps the node's disk (retention.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc

from tfcluster import __version__, wire
from tfcluster.api.v1 import agent_pb2
from tfcluster.commands import (CancelLog, ExpectFiles, FinishTraining, Launch, Probe, ReadLog, Revocations, ServeCode,
                                SetPace, Stop)
from tfcluster.daemon.agent.code.cache import DEFAULT_CACHE_BYTES
from tfcluster.daemon.agent.code.fetch import Fetcher
from tfcluster.daemon.agent.code.task_code import TaskCode
from tfcluster.daemon.agent.code.unpack import DEFAULT_MAX_BYTES as DEFAULT_MAX_UNPACKED_BYTES
from tfcluster.daemon.agent.code.unpack import Bounds
from tfcluster.daemon.agent.hooks.api import POLL_SECONDS, TaskHook
from tfcluster.daemon.agent.hooks.copies import CopiesHook
from tfcluster.daemon.agent.hooks.events import EventsHook
from tfcluster.daemon.agent.hooks.shipping import ShippingHook
from tfcluster.daemon.agent.hooks.summaries import SummariesHook
from tfcluster.daemon.agent.hooks.summary_upload import SummaryUploadHook
from tfcluster.daemon.agent.node.gpu_health import GpuHealth
from tfcluster.daemon.agent.node.health import HealthCheck
from tfcluster.daemon.agent.node.logs import LogServer
from tfcluster.daemon.agent.node.metrics import AgentMetrics
from tfcluster.daemon.agent.node.probe import answer as probe_answer
from tfcluster.daemon.agent.node.probe import interface_of
from tfcluster.daemon.agent.node.retention import Policy, RetentionPass, ask_coordinator, disk_condition, free_bytes
from tfcluster.daemon.agent.peers.server import DEFAULT_QUOTA_BYTES, Expectation, PeerServer, PeerServicer, RevokedNodes
from tfcluster.daemon.agent.session.discovery import HostInfo
from tfcluster.daemon.agent.session.identity import NodeIdentity
from tfcluster.daemon.agent.session.liveness import Liveness
from tfcluster.daemon.agent.session.session import Session
from tfcluster.daemon.agent.shim.cgroups import TaskCgroups
from tfcluster.daemon.agent.shim.tasklog import DEFAULT_LIMIT_BYTES
from tfcluster.daemon.agent.tasks.record import TaskRecord
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.daemon.agent.tasks.users import PER_JOB, TaskUsers, make_state_dir
from tfcluster.daemon.web import ThreadedWebListener, WebListener
from tfcluster.layout import INCOMING_PREFIX
from tfcluster.model import Gpu, NodeInfo, TaskProgress
from tfcluster.pki import REMOVED, REPLACED
from tfcluster.security import Credentials
from tfcluster.states import Phase

log = logging.getLogger("tfcluster.agent")

LOG_BACKLOG_MESSAGES = 16  # log chunks of 64 KiB queued for the stream at most
# What a registration's task reports may take (the coordinator takes 16 MiB, security.NODE_MESSAGE): the ended
# attempts' last lines (up to 80 KB each) are sent within it, newest first; beyond it an exit goes without them
# and with the start of its message. A node that kept hundreds of chatty exits could not register at all.
REGISTER_REPORTS_BYTES = 4 << 20
SHORT_MESSAGE_CHARS = 200
LOG_BACKLOG_WAIT_SECONDS = 0.01


@dataclass(frozen=True)
class AgentConfig:
    coordinator: str
    name: str
    address: str
    port_range: tuple[int, int]
    gpus: tuple[Gpu, ...]
    host: HostInfo
    state_dir: Path
    peer_port: int = 0  # AgentPeerService (checkpoints from other agents); 0: none
    credentials: Credentials = field(default_factory=Credentials)  # the node's certificate; none: --insecure
    identity: NodeIdentity | None = None  # where the certificate lives, to renew it
    peer_quota_bytes: int = DEFAULT_QUOTA_BYTES  # checkpoint bytes other agents may send for one job
    retention: Policy = field(default_factory=Policy)  # what the node keeps of its jobs' files; its disk floor
    task_log_bytes: int = DEFAULT_LIMIT_BYTES  # output kept per task attempt (its head and its newest bytes)
    http_listen: str = ""  # HOST:PORT of /metrics; "": none
    allow_root_tasks: bool = False  # the operator lets tasks run as root here (tasks/users.py)
    private_tmp: bool = False  # each job's tasks get a /tmp of their own (isolation.py)
    task_user: str = PER_JOB  # who tasks run as: the job's own UID, or the owner's account (tasks/users.py)
    cache_bytes: int = DEFAULT_CACHE_BYTES  # the most the node keeps of jobs' code (code/cache.py)
    max_code_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES  # one archive's files together, unpacked (unpack.py)
    health: HealthCheck | None = None  # the operator's health check program (node/health.py); None: none runs
    gpu_health: GpuHealth | None = None  # the NVML checks of its GPUs (node/gpu_health.py); None: none run
    labels: tuple[str, ...] = ()  # the kinds of machine it is (--label), sent at registration

    def node_info(self) -> NodeInfo:
        return NodeInfo(name=self.name, address=self.address, port_range=self.port_range, gpus=self.gpus,
                        hostname=self.host.hostname, cpu_count=self.host.cpu_count,
                        memory_bytes=self.host.memory_bytes, agent_version=__version__,
                        state_dir=str(self.state_dir), peer_port=self.peer_port, labels=self.labels,
                        gpu_driver=self.host.gpu_driver, cuda_version=self.host.cuda_version)


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.credentials = config.credentials  # replaced when the certificate is renewed
        self.task_users = TaskUsers(config.allow_root_tasks, private_tmp=config.private_tmp, mode=config.task_user)
        make_state_dir(config.state_dir)  # its modes set right, whoever made it
        self._stop = threading.Event()
        self.liveness = Liveness(("connection", "events"))  # see liveness.py
        self.session = Session(config.coordinator, self, self._stop, self.liveness, self._refused)
        self.supervisor = Supervisor(config.state_dir, self._on_task_change, self.condition, config.task_log_bytes,
                                     self.task_users)
        if self.task_users.agent_is_root:
            cgroups = self.supervisor.starter.cgroups = TaskCgroups()
            log.info("memory limits: %s", f"kept by the kernel in task cgroups under {cgroups.delegated}"
                     if cgroups.delegated else f"kept by watching each task's processes ({cgroups.why_not})")
        self.supervisor.starter.nccl_interface = interface_of(config.address)
        fetcher = Fetcher(lambda: self.session.coordinator, lambda: self.credentials)
        bounds = Bounds(config.max_code_unpacked_bytes, min_free_bytes=config.retention.min_free_bytes)
        self.supervisor.code = TaskCode(config.state_dir, config.cache_bytes, fetcher, self.task_users.agent_is_root,
                                        fetcher.transfers.get, bounds)
        log.info("jobs' code: cached in %s (at most %d bytes); tasks work in %s", self.supervisor.code.cache.directory,
                 config.cache_bytes, self.supervisor.code.workspaces.how)
        self.logs = LogServer(self.supervisor, self._send_log)
        self.metrics = AgentMetrics(self.supervisor, config.gpus, str(config.state_dir))
        send, credentials = self.session.send, lambda: self.credentials
        summaries = SummariesHook(send)
        # Every per-task feature, in the order each is called (an attempt's own events before its summaries).
        self.hooks: list[TaskHook] = [
            EventsHook(send, reports_itself=summaries.reports_itself), summaries,
            SummaryUploadHook(send, self.session.outbound.qsize),
            ShippingHook(self.supervisor.current, credentials, self.metrics),
            CopiesHook(config.state_dir, send, credentials, self.metrics)]
        self.commands = {kind: hook for hook in self.hooks for kind in hook.commands}
        self.supervisor.on_forget = self._forget
        self._hook_session = 0  # registrations so far: an ended attempt is polled until its hooks finish in one
        # Jobs whose checkpoint files the peer port accepts, from the sender the coordinator named (a restarted
        # agent is told again when it registers); certificates it refuses.
        self.expected: dict[str, Expectation] = {}
        self.revoked = RevokedNodes()
        self.peer_server: PeerServer | None = None
        self.web: ThreadedWebListener | None = None

    # The session's state, as systemd's reporter (liveness.py) and the daemon's main read it.
    connected = property(lambda self: self.session.connected)
    registered = property(lambda self: self.session.registered)
    trouble = property(lambda self: self.session.trouble)
    refused = property(lambda self: self.session.refused)

    # ---- lifecycle -----------------------------------------------------------------------------

    def run(self) -> None:
        """Registers and serves the stream until stop() or a refusal; reconnects with backoff on any failure."""
        adopted = self.supervisor.adopt_running()
        if adopted:
            log.info("reattached to %d running tasks", adopted)
        self.supervisor.code.recover({r.dir: r.attempt.job_id for r in self.supervisor.snapshot()
                                      if not r.exited.is_set()})
        retention = RetentionPass(self.config.state_dir, self.config.retention, self._jobs_in_use,
                                  lambda job_ids: ask_coordinator(self.session.coordinator, lambda: self.credentials, job_ids),
                                  self.supervisor.environments)
        threading.Thread(target=retention.run, args=(self._stop,), name="retention", daemon=True).start()
        threading.Thread(target=self.supervisor.launcher.warm, name="launcher", daemon=True).start()
        threading.Thread(target=self._poll_hooks, name="events", daemon=True).start()
        if self.config.identity is not None:
            threading.Thread(target=self._renew_certificate, name="renew", daemon=True).start()
        if self.config.peer_port and self.peer_server is None:
            self.serve_peers()
        # Before registering: a node (or a GPU) found sick gets nothing placed on it, not even once.
        for name, check in (("health", self.config.health), ("gpu-health", self.config.gpu_health)):
            if check is not None:
                check.check()
                threading.Thread(target=check.run, args=(self._stop,), name=name, daemon=True).start()
        self.session.run()

    def serve_peers(self) -> None:
        """Starts receiving checkpoints from other agents (raises OSError when the port is taken)."""
        servicer = PeerServicer(self.config.state_dir, self.expected.get, self.config.peer_quota_bytes,
                                is_revoked=self.revoked.refusal, code=self.supervisor.code.serving)
        self.peer_server = PeerServer(f"{self.config.address}:{self.config.peer_port}", servicer,
                                      lambda: self.credentials)
        self.peer_server.start()

    def serve_http(self) -> None:
        """Starts serving /metrics on --http-listen (raises OSError when the address cannot be served)."""
        if self.config.http_listen and self.web is None:
            listener = WebListener(self.config.http_listen, self.credentials, self.metrics.registry)
            self.web = ThreadedWebListener(listener).start()

    def _renew_certificate(self) -> None:
        """Renews the node's certificate at about two thirds of its life, then reconnects with the new one."""
        identity = self.config.identity
        while not self._stop.wait(max(0.0, identity.renew_at() - time.time())):
            try:
                with self.credentials.channel(self.session.coordinator) as channel:
                    self.credentials = identity.renew(channel)
                if self.web is not None:
                    self.web.renew(self.credentials)
            except Exception as e:  # refused, unreachable, or its files not written: never ends the renewals
                left = identity.expires_at() - time.time()
                why = (e.details() or e.code().name) if isinstance(e, grpc.RpcError) else f"{type(e).__name__}: {e}"
                log.warning("renewing the certificate failed (%s); it expires in %.0f s; retrying", why, left)
                if self._stop.wait(min(60.0, max(1.0, left / 10))):
                    return
                continue
            self.session.reconnect()  # the session starts again with the new certificate

    def stop(self, stop_tasks: bool = False, grace_seconds: float = 10.0) -> None:
        # A restart, most likely: the coordinator waits longer for it before its tasks count lost. Said first: once
        # _stop is set the stream's sender ends at its next wake-up, and a word queued after that is never sent.
        if not stop_tasks:
            self.session.leave()
        self._stop.set()
        self.logs.stopped.set()
        if self.peer_server is not None:
            self.peer_server.stop(1)
        if self.web is not None:
            self.web.stop()
        self.session.cancel()
        if stop_tasks:
            self.supervisor.stop_all(grace_seconds)
        self.supervisor.launcher.close()

    def _refused(self, why: str) -> None:
        # A removed or replaced node's tasks run on elsewhere; nobody will ever stop these.
        self.stop(stop_tasks=REMOVED in why or REPLACED in why)

    # ---- what the session asks of the agent ----------------------------------------------------

    def node_info(self) -> NodeInfo:
        return self.config.node_info()

    def task_reports(self) -> list:
        """For a registration: every attempt the supervisor keeps (the coordinator counts a task it thinks runs here
        and does not find lost), those still running first, ended ones newest first with their last lines while
        they fit REGISTER_REPORTS_BYTES, without beyond: the coordinator heard of nearly all of them when they ended,
        and one it never heard of still ends with its exit code and why (its whole output stays in its log). No
        more than the coordinator takes (wire.MAX_TASKS_PER_NODE): the oldest ended ones are left out past it."""
        records = [r for r in self.supervisor.snapshot() if r.phase != Phase.STARTING]
        ended = sorted((r for r in records if r.exited.is_set()), key=lambda r: r.finished_at, reverse=True)
        reports = [wire.task_report_to_proto(r.report()) for r in records if not r.exited.is_set()]
        ended = ended[:max(0, wire.MAX_TASKS_PER_NODE - len(reports))]
        room = REGISTER_REPORTS_BYTES - sum(report.ByteSize() for report in reports)
        for record in ended:
            report = record.report()
            message = wire.task_report_to_proto(report)
            room -= message.ByteSize()
            if room < 0 and report.exit is not None:
                short = replace(report.exit, log_tail=(), message=report.exit.message[:SHORT_MESSAGE_CHARS])
                message = wire.task_report_to_proto(replace(report, exit=short))
            reports.append(message)
        return reports

    def progress(self) -> list[TaskProgress]:
        progress = self.supervisor.progress()
        gpu_use = self.metrics.gpus.task_utilization()
        return [replace(p, gpu_utilization=gpu_use[p.attempt]) if p.attempt in gpu_use else p for p in progress]

    def condition(self) -> str:
        """Why this node takes no new tasks now ("" while it takes them): its free disk is below the floor."""
        state_dir = self.config.state_dir
        return disk_condition(state_dir, free_bytes(state_dir), self.config.retention.min_free_bytes)

    def health(self) -> str:
        """The health check's last failure ("" while the node passes, or when none runs)."""
        return self.config.health.failure if self.config.health is not None else ""

    def conditions(self) -> tuple:
        """What the last GPU check found (none when no check runs)."""
        return self.config.gpu_health.conditions if self.config.gpu_health is not None else ()

    def on_register(self) -> None:
        for hook in self.hooks:
            hook.on_register()
        self._hook_session += 1  # after: a poll that marks an attempt finished in this session saw the hooks reset

    # ---- up: reports, hooks, logs --------------------------------------------------------------

    def _on_task_change(self, record: TaskRecord) -> None:
        if record.exited.is_set():
            # What the hooks have for the attempt (its final evaluation) must reach the coordinator before its exit.
            self._each_hook(record, "on_exit")
        self.session.send(agent_pb2.AgentMessage(task=wire.task_report_to_proto(record.report())))

    def _poll_hooks(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self.liveness.stamp("events")
            if self.session.connected.is_set():
                try:
                    self.poll_hooks_once()
                except Exception:  # the next poll tries again; the thread must live on
                    log.exception("polling the task hooks failed")

    def poll_hooks_once(self) -> None:
        """Polls the hooks for each running attempt, and for each ended one until every hook is finished with it
        in this session (a registration begins another: the hooks may send it all again)."""
        session = self._hook_session
        for record in self.supervisor.snapshot():
            if record.hooks_finished == session:
                continue
            ended = record.exited.is_set()  # before the polls: what they read of an ended attempt is all of it
            self._each_hook(record, "on_poll")
            if ended and all(hook.finished_with(record) for hook in self.hooks):
                record.hooks_finished = session

    def _each_hook(self, record: TaskRecord, method: str) -> None:
        for hook in self.hooks:
            try:
                getattr(hook, method)(record)
            except Exception:  # one hook's failure on one task must not stop the others, nor its exit report
                log.exception("%s: %s failed", record.name, type(hook).__name__)

    def _forget(self, forgotten: list[TaskRecord]) -> None:
        """The supervisor no longer keeps these ended attempts: what the hooks keep for them goes, and the code this
        node serves its peers for their jobs once it keeps no attempt of them (a peer then fetches it elsewhere).
        What it expects of a job's checkpoint files stays: it comes before the job's next task is launched here,
        while no attempt of the job may be kept."""
        for record in forgotten:
            self._each_hook(record, "on_forget")
        if self.supervisor.code is not None:
            gone = {r.attempt.job_id for r in forgotten}
            self.supervisor.code.serving.forget({job_id for job_id in gone if not self.supervisor.keeps_job(job_id)})

    def _jobs_in_use(self) -> set[str]:
        """Jobs whose files retention must leave alone: a task runs, a hook works on its files (checkpoints being
        copied from here), or checkpoints are being received for a restart."""
        receiving = {path.parent.name for path in self.config.state_dir.glob(f"jobs/*/{INCOMING_PREFIX}*")}
        return self.supervisor.running_jobs().union(receiving, *(hook.jobs_in_use() for hook in self.hooks))

    def _send_log(self, data) -> None:
        """Called by the log threads: waits while the stream is busy, so reading a huge log neither fills this
        process's memory nor holds heartbeats up behind it."""
        while self.session.outbound.qsize() > LOG_BACKLOG_MESSAGES and not self._stop.is_set():
            time.sleep(LOG_BACKLOG_WAIT_SECONDS)
        self.session.send(wire.log_data_to_proto(data))

    def _probe(self, probe: Probe) -> None:
        """`tfcluster doctor` asked: listen, or connect, and answer (node/probe.py)."""
        try:
            self.session.send(wire.probe_answer_to_proto(probe_answer(probe, self.config.port_range,
                                                                      self.config.address)))
        except Exception:  # one failed probe must not take anything else down
            log.exception("probe %d failed", probe.probe_id)

    # ---- down: commands ------------------------------------------------------------------------

    def handle(self, message: agent_pb2.CoordinatorMessage) -> None:
        try:
            command = wire.command_from_proto(message, self.config.name)
            if isinstance(command, Launch):
                # Recorded in line (a stop that follows must find the task it stops); started on a thread.
                self.supervisor.launch(command)
            elif isinstance(command, Stop):
                self.supervisor.stop(command.attempt, command.grace_seconds)
            elif isinstance(command, FinishTraining):
                self.supervisor.finish_training(command.attempt, command.final_checkpoint)
            elif isinstance(command, ExpectFiles):
                self.expected[command.job_id] = Expectation(command.sender, command.uid, command.gid)
            elif isinstance(command, ServeCode):
                self.supervisor.code.serving.serve_to(command.job_id, command.fetcher)
            elif isinstance(command, Revocations):
                self.revoked.update(command.revoked)
            elif isinstance(command, ReadLog):
                self.logs.read(command)
            elif isinstance(command, CancelLog):
                self.logs.cancel(command.request_id)
            elif isinstance(command, SetPace):
                self.session.set_pace(command.heartbeat_interval_seconds)
            elif isinstance(command, Probe):  # connects take seconds: not on the stream's thread
                threading.Thread(target=self._probe, args=(command,), name="probe", daemon=True).start()
            elif type(command) in self.commands:
                self.commands[type(command)].handle(command)
        except Exception:  # one bad command must not take the agent down
            log.exception("command %s failed", message.WhichOneof("kind"))
