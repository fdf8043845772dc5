"""The `tfcluster agent` process: its settings checked, its node discovered, then it serves until SIGTERM or
SIGINT, or until the coordinator refuses it."""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import threading
from pathlib import Path

from tfcluster import __version__, leaders
from tfcluster.daemon.agent.node.gpu_health import DEFAULT_INTERVAL_SECONDS as DEFAULT_GPU_CHECK_SECONDS
from tfcluster.daemon.agent.node.gpu_health import GpuHealth
from tfcluster.daemon.agent.node.health import HealthCheck
from tfcluster.daemon.agent.node.nvml_health import NvmlReader
from tfcluster.daemon.agent.agent import Agent, AgentConfig
from tfcluster.daemon.agent.code.cache import DEFAULT_CACHE_BYTES
from tfcluster.daemon.agent.code.unpack import DEFAULT_MAX_BYTES as DEFAULT_MAX_UNPACKED_BYTES
from tfcluster.daemon.agent.node.retention import Policy
from tfcluster.daemon.agent.peers.server import DEFAULT_QUOTA_BYTES
from tfcluster.daemon.agent.session.discovery import InventoryError, advertise_address, discover_gpus, host_info
from tfcluster.daemon.agent.session.identity import JoinError, NodeIdentity
from tfcluster.daemon.agent.session.liveness import SystemdReporter
from tfcluster.daemon.agent.shim.tasklog import DEFAULT_LIMIT_BYTES
from tfcluster.daemon.agent.tasks.users import OWNER, PER_JOB, TASK_USER_MODES, TaskUserError, make_state_dir
from tfcluster.daemon.notify import Notifier
from tfcluster.daemon.web import HttpError, parse_listen
from tfcluster.labels import label_problem
from tfcluster.model import NODE_NAME_RE
from tfcluster.security import Credentials

log = logging.getLogger("tfcluster.agent")

EXIT_REFUSED = 78  # EX_CONFIG: restarting would be refused again (the systemd unit does not restart on it)
TICK_SECONDS = 0.5  # how often the main loop checks for a signal and reports to systemd


class SettingsError(ValueError):
    """A flag that cannot work; the message names it."""


def configure(coordinator: str, name: str | None, address: str | None, port_range: str, peer_port: int | None,
              gpu_inventory: str | None, state_dir: Path, token: str | None, insecure: bool = False,
              join: str = "", ca_cert: Path | None = None, ca_hash: str = "", join_address: str = "",
              peer_quota: int = DEFAULT_QUOTA_BYTES, http_listen: str = "", retention: Policy = Policy(),
              task_log_bytes: int = DEFAULT_LIMIT_BYTES, allow_root_tasks: bool = False,
              private_tmp: bool = False, task_user: str = PER_JOB,
              cache_bytes: int = DEFAULT_CACHE_BYTES,
              max_code_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES,
              health: HealthCheck | None = None,
              gpu_check_seconds: float = DEFAULT_GPU_CHECK_SECONDS,
              labels: tuple[str, ...] = ()) -> AgentConfig:
    """The agent's settings from its flags, with the node's GPUs, host and address discovered, and its
    certificate: the one it has, or one it gets by joining with a token."""
    try:
        first, last = (int(p) for p in port_range.split("-"))
        if not 1 <= first <= last <= 65535:
            raise ValueError
    except ValueError:
        raise SettingsError(f"--port-range: expected FIRST-LAST with 1 <= FIRST <= LAST <= 65535, got "
                            f"{port_range!r}") from None
    if peer_port is None:
        peer_port, first = first, first + 1
        if first > last:
            raise SettingsError(f"--port-range: {port_range} leaves no port for tasks after the agent's own "
                                f"(the first)")
    elif first <= peer_port <= last:
        raise SettingsError(f"--peer-port {peer_port} lies inside --port-range {port_range}, which is for tasks")
    if http_listen:
        try:
            parse_listen(http_listen)
        except HttpError as e:
            raise SettingsError(str(e)) from None
    try:
        first_coordinator = leaders.parse(coordinator)[0]
    except (ValueError, IndexError):
        raise SettingsError(f"--coordinator: expected HOST:PORT[,HOST:PORT...], got {coordinator!r}") from None
    _check_task_user(task_user, insecure, allow_root_tasks)
    name = name or socket.gethostname()
    if not NODE_NAME_RE.fullmatch(name):
        raise SettingsError(f"--name: expected letters, digits, '.', '_' or '-' (at most 253), got {name!r}")
    problem = label_problem(labels)
    if problem:
        raise SettingsError(f"--label: {problem}")
    if address is not None:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise SettingsError(f"--advertise-address: expected an IP address, got {address!r}") from None
    try:
        gpus = discover_gpus(gpu_inventory)
        host = host_info(gpu_inventory)
        address = address or advertise_address(first_coordinator)
    except (InventoryError, OSError) as e:
        raise SettingsError(str(e)) from None
    state_dir = state_dir.resolve()
    try:
        make_state_dir(state_dir)
    except (OSError, TaskUserError) as e:
        raise SettingsError(f"--state-dir {state_dir}: {e}") from None
    identity = None if insecure else NodeIdentity(state_dir, name, address)
    if identity is None:
        credentials = Credentials(token=token)
    elif token:
        raise SettingsError("--token-file goes with --insecure; with TLS the node's certificate takes its place")
    else:
        credentials = _node_credentials(identity, coordinator, join, ca_cert, ca_hash, join_address)
    return AgentConfig(coordinator=coordinator, name=name, address=address, port_range=(first, last),
                       gpus=tuple(gpus), host=host, state_dir=state_dir, peer_port=peer_port,
                       credentials=credentials, identity=identity, peer_quota_bytes=peer_quota,
                       http_listen=http_listen, retention=retention, task_log_bytes=task_log_bytes,
                       allow_root_tasks=allow_root_tasks, private_tmp=private_tmp, task_user=task_user,
                       cache_bytes=cache_bytes, max_code_unpacked_bytes=max_code_unpacked_bytes, health=health,
                       gpu_health=_gpu_health(gpus, gpu_inventory, gpu_check_seconds), labels=labels)


def _gpu_health(gpus: list, gpu_inventory: str | None, interval: float) -> GpuHealth | None:
    """The NVML checks of the GPUs NVML found; none for GPUs declared by inventory (NVML may not know them), for
    a node without GPUs, or when turned off (interval 0)."""
    if gpu_inventory is not None or not gpus or interval <= 0:
        return None
    if interval < 1:
        raise SettingsError(f"--gpu-check-interval: expected 0 (off) or 1s or more, got {interval:g} s")
    return GpuHealth(NvmlReader(tuple(gpus)), interval)


def _check_task_user(task_user: str, insecure: bool, allow_root_tasks: bool) -> None:
    """--task-user owner needs owners the coordinator vouches for: with --insecure no job has one (a name a
    client merely claimed would let anyone run tasks as any account of the node)."""
    if task_user not in TASK_USER_MODES:
        raise SettingsError(f"--task-user: expected one of {', '.join(TASK_USER_MODES)}, got {task_user!r}")
    if task_user == OWNER and insecure:
        raise SettingsError("--task-user owner needs the cluster's certificates: with --insecure no job has an "
                            "authenticated owner to run as")
    if task_user == OWNER and allow_root_tasks:
        raise SettingsError("--task-user owner runs tasks as their owners' accounts, --allow-root-tasks as root: "
                            "give one of them")


def _node_credentials(identity: NodeIdentity, coordinator: str, join: str, ca_cert: Path | None, ca_hash: str,
                      join_address: str) -> Credentials:
    """The certificate the node has; else one it gets with the join token."""
    try:
        credentials = identity.load()
    except JoinError as e:
        raise SettingsError(str(e)) from None
    if credentials is not None:
        return credentials
    if not join:
        raise SettingsError(f"no certificate in {identity.dir}: join the cluster with --join-token-file FILE (a token "
                            f"from `tfcluster token create`) and --ca-cert FILE or --ca-hash sha256:..., or run with "
                            f"--insecure")
    if (ca_cert is None) == (not ca_hash):
        raise SettingsError("joining needs the cluster CA: --ca-cert FILE or --ca-hash sha256:... (one of them)")
    if ca_hash and not ca_hash.startswith("sha256:"):
        raise SettingsError(f"--ca-hash: expected sha256:<hex> (`tfcluster ca init` prints it), got {ca_hash!r}")
    try:
        ca = ca_cert.read_bytes() if ca_cert else None
    except OSError as e:
        raise SettingsError(f"--ca-cert {ca_cert}: cannot read: {e.strerror or e}") from None
    try:
        return identity.join(join_address or ",".join(map(_join_port, leaders.parse(coordinator))), join, ca, ca_hash)
    except JoinError as e:
        raise SettingsError(str(e)) from None


def _join_port(coordinator: str) -> str:
    """The coordinator's join port, by default the port after its own."""
    host, _, port = coordinator.rpartition(":")
    return f"{host}:{int(port) + 1}" if port.isdigit() else coordinator


def serve(config: AgentConfig, stop_tasks_on_exit: bool, notifier: Notifier | None = None) -> str:
    """Runs the agent until a signal; returns why the coordinator refused it ("" when it was not). Raises
    OSError when the peer port cannot be served. Tells systemd when it is ready, how it is doing, that its
    loops still turn, and when it stops (see liveness.py)."""
    notifier = notifier or Notifier.from_environment()
    gpus = "".join(f" [{g.index}: {g.name} {g.uuid}]" for g in config.gpus)
    log.info("agent %s: node %s, address %s, %d GPUs%s, task ports %d-%d, peer port %d, state %s", __version__,
             config.name, config.address, len(config.gpus), gpus, *config.port_range, config.peer_port,
             config.state_dir)
    agent = Agent(config)
    agent.task_users.announce()
    agent.serve_peers()
    agent.serve_http()
    reporter = SystemdReporter(agent, notifier)
    thread = threading.Thread(target=agent.run, name="agent", daemon=True)
    thread.start()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(TICK_SECONDS):
        if not thread.is_alive():  # it ended by itself: refused
            reporter.stopping()
            break
        reporter.tick()
    else:
        reporter.stopping()
        agent.stop(stop_tasks=stop_tasks_on_exit)
    thread.join(timeout=5)
    return agent.refused
