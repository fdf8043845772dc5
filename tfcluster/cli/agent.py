"""`tfcluster agent`: the daemon on every node."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from tfcluster.auth import TokenError, load_token
from tfcluster.cli.common import app, default_state_dir, fail, parse_duration, parse_size, read_token
from tfcluster.cli.daemon_flags import LogFormatOpt, LogLevelOpt, setup_logging
from tfcluster.cli.node import MinFreeDiskOpt, RetainBytesOpt, RetainForOpt, retention_policy


@app.command()
def agent(
    coordinator: str = typer.Option(..., "--coordinator", "-c", metavar="HOST:PORT", help="Coordinator address."),
    name: Optional[str] = typer.Option(None, help="Node name [default: the hostname]."),
    advertise_address: Optional[str] = typer.Option(None, metavar="IP",
                                                    help="IP other nodes use to reach this node's tasks "
                                                         "[default: the address of the interface that reaches the coordinator]."),
    port_range: str = typer.Option("20000-20999", metavar="FIRST-LAST",
                                   help="Ports of this agent: the first receives checkpoints from other agents "
                                        "(unless --peer-port says otherwise), tasks use the others."),
    peer_port: Optional[int] = typer.Option(None, min=1, max=65535,
                                            help="Port that receives checkpoints from other agents "
                                                 "[default: the first of --port-range]."),
    label: list[str] = typer.Option([], "--label", envvar="TFCLUSTER_LABELS", metavar="NAME",
                                    help="A kind of machine this node is (a100, gpu=a100, rack=r12), which a job's "
                                         "role may ask for with `labels = [...]`; repeat for more (at most 32). "
                                         "Lowercase letters, digits, '.', '_', '-', one '=' at most, up to 63 "
                                         "characters, each part starting and ending with a letter or digit "
                                         "[env: TFCLUSTER_LABELS, separated by spaces, as `tfcluster up` sets it]."),
    gpu_inventory: Optional[str] = typer.Option(None, metavar="FILE|none",
                                                help="Declare GPUs from a JSON file instead of NVML; 'none' for CPU only."),
    state_dir: Optional[Path] = typer.Option(None, help="Task logs and files "
                                                        "[default: /var/lib/tfcluster/agent as root, else ~/.local/state/tfcluster/agent]."),
    stop_tasks_on_exit: bool = typer.Option(False, help="Stop this node's tasks when the agent exits "
                                                        "(by default they keep running and a restarted agent reattaches)."),
    join_token_file: Optional[Path] = typer.Option(
        None, envvar="TFCLUSTER_JOIN_TOKEN_FILE", metavar="FILE",
        help="A file holding the token (`tfcluster token create`) the node joins the cluster with when it has no "
             "certificate yet; a restart reuses the certificate, and the file may be gone by then [env: TFCLUSTER_JOIN_TOKEN_FILE; or the token itself "
             "in TFCLUSTER_JOIN_TOKEN, as the systemd unit's env file sets it]."),
    join: Optional[str] = typer.Option(None, "--join", hidden=True),
    ca_cert: Optional[Path] = typer.Option(None, metavar="FILE", help="The cluster CA's certificate (ca.crt), "
                                                                      "to trust the coordinator when joining."),
    ca_hash: Optional[str] = typer.Option(None, metavar="sha256:HEX",
                                          help="Instead of --ca-cert: the hash `tfcluster ca init` printed; the CA "
                                               "is fetched from the coordinator and must match it."),
    join_address: Optional[str] = typer.Option(None, metavar="HOST:PORT",
                                               help="The coordinator's join port [default: its port + 1]."),
    peer_quota: str = typer.Option("64G", metavar="SIZE",
                                   help="Checkpoint bytes other agents may send this node for one job, e.g. 500M, "
                                        "64G, 2T."),
    cache_bytes: str = typer.Option("10G", metavar="SIZE",
                                    help="The most the node keeps of jobs' code (archives and their unpacked "
                                         "trees): past it the least recently used go, never one a running task "
                                         "uses."),
    max_code_unpacked_bytes: str = typer.Option("4G", metavar="SIZE",
                                                help="The most one job's code archive may unpack to on this node "
                                                     "(its files added up, a sparse file at its full size); an "
                                                     "archive past it, or one that would leave less free disk than "
                                                     "--min-free-disk, is refused before anything is written, and "
                                                     "its tasks fail to start with the reason."),
    retain_for: str = RetainForOpt,
    retain_bytes: str = RetainBytesOpt,
    min_free_disk: str = MinFreeDiskOpt,
    max_task_log: str = typer.Option("256M", metavar="SIZE",
                                     help="Output kept per task attempt: past it the first quarter and the newest "
                                          "bytes stay, and `tfcluster logs` marks what was dropped between them."),
    insecure: bool = typer.Option(False, "--insecure",
                                  help="Talk plain text to a coordinator run with --insecure, and accept checkpoint "
                                       "files from anyone. For tests and throwaway clusters only."),
    token_file: Optional[str] = typer.Option(None, envvar="TFCLUSTER_TOKEN_FILE", metavar="FILE",
                                             help="With --insecure: the coordinator's shared token, also required "
                                                  "from other agents [env: TFCLUSTER_TOKEN_FILE]."),
    http_listen: Optional[str] = typer.Option(None, metavar="HOST:PORT",
                                              help="Serve Prometheus metrics at /metrics here (HTTPS with the node's "
                                                   "certificate: clients need an admin or viewer one) "
                                                   "[default: off]."),
    allow_root_tasks: bool = typer.Option(False, "--allow-root-tasks",
                                          help="Run every task on this node as root, as agents before 0.3 did "
                                               "(whoever may submit a job then owns this node). By default each "
                                               "job's tasks run as the job's own UID from the coordinator."),
    task_user: str = typer.Option("job", "--task-user", metavar="job|owner",
                                  help="Who tasks run as: `job`, a UID of the job's own from the coordinator; "
                                       "`owner`, the local account named as the job's owner (its certificate's "
                                       "name), with that account's groups, as Slurm does; a job whose owner has "
                                       "no account on this node fails to start, and uid 0 is refused."),
    private_tmp: bool = typer.Option(False, "--private-tmp",
                                     help="Give each job's tasks a /tmp of their own (a mount namespace, as systemd's "
                                          "PrivateTmp), so programs that write fixed /tmp paths never meet another "
                                          "job's files; what tasks run and read must then lie outside /tmp "
                                          "[default: off: TMPDIR is the job's own dir]."),
    uv_index_url: Optional[str] = typer.Option(None, "--uv-index-url", metavar="URL",
                                               help="The package index jobs' environments are built from (sets "
                                                    "UV_INDEX_URL) [default: UV_INDEX_URL, else PyPI]."),
    uv_find_links: Optional[str] = typer.Option(None, "--uv-find-links", metavar="DIR|URL",
                                                help="Where else jobs' environments find wheels: a directory or a page "
                                                     "of links (sets UV_FIND_LINKS) [default: UV_FIND_LINKS]."),
    health_check_program: Optional[Path] = typer.Option(
        None, metavar="PATH", help="A program that checks this node (Slurm's HealthCheckProgram convention, LBNL "
                                   "NHC for one): run before registering and every --health-check-interval; "
                                   "exiting non-zero with a line of reason drains the node with that line, and "
                                   "passing again lifts that drain [default: none]."),
    health_check_interval: str = typer.Option("5m", metavar="DURATION",
                                              help="How often --health-check-program runs, e.g. 30s or 5m."),
    gpu_check_interval: str = typer.Option("1m", metavar="DURATION",
                                           help="How often the agent checks its GPUs through NVML (Xid errors, "
                                                "uncorrectable ECC, pages or rows pending retirement, GPUs lost, "
                                                "throttling), after a first check before registering; 0 turns "
                                                "the checks off. GPUs declared by --gpu-inventory are not "
                                                "checked."),
    log_level: str = LogLevelOpt,
    log_format: str = LogFormatOpt,
) -> None:
    """Run the agent of this node: discover GPUs, register, launch and watch tasks."""
    from tfcluster.daemon.agent.main import EXIT_REFUSED, SettingsError, configure, serve

    setup_logging(log_level, log_format)
    token = read_token(token_file)
    if token and not insecure:
        fail("--token-file goes with --insecure; with TLS the node's certificate takes its place", 2)
    if join is not None:
        fail("--join: a token on the command line is visible to every user of this host; put it in a file "
             "(--join-token-file FILE, mode 0600) or in TFCLUSTER_JOIN_TOKEN (the systemd unit's env file)", 2)
    join = _join_token(join_token_file)
    # uv reads these when the agent builds an environment (environments.py); tasks that run uv see them too.
    for variable, value in (("UV_INDEX_URL", uv_index_url), ("UV_FIND_LINKS", uv_find_links)):
        if value:
            os.environ[variable] = value
    try:
        config = configure(coordinator, name, advertise_address, port_range, peer_port, gpu_inventory,
                           state_dir or default_state_dir("agent"), token, insecure=insecure, join=join or "",
                           ca_cert=ca_cert, ca_hash=ca_hash or "", join_address=join_address or "",
                           peer_quota=parse_size(peer_quota, "--peer-quota"), http_listen=http_listen or "",
                           retention=retention_policy(retain_for, retain_bytes, min_free_disk),
                           task_log_bytes=_task_log_bytes(max_task_log), allow_root_tasks=allow_root_tasks,
                           private_tmp=private_tmp, task_user=task_user,
                           cache_bytes=parse_size(cache_bytes, "--cache-bytes"),
                           max_code_unpacked_bytes=parse_size(max_code_unpacked_bytes, "--max-code-unpacked-bytes"),
                           health=_health_check(health_check_program, health_check_interval),
                           gpu_check_seconds=parse_duration(gpu_check_interval, "--gpu-check-interval"),
                           labels=tuple(label))
    except SettingsError as e:
        fail(str(e), 2)
    try:
        refused = serve(config, stop_tasks_on_exit)
    except (OSError, RuntimeError) as e:
        fail(str(e) if str(e).startswith("--http-listen") else f"--peer-port {config.peer_port}: {e}")
    if refused:
        fail(f"the coordinator at {coordinator} refused this agent: {refused}", EXIT_REFUSED)


def _task_log_bytes(text: str) -> int:
    from tfcluster.daemon.agent.shim.tasklog import MIN_LIMIT_BYTES

    size = parse_size(text, "--max-task-log")
    if size < MIN_LIMIT_BYTES:
        fail(f"--max-task-log: expected at least {MIN_LIMIT_BYTES // 1024}K, got {text!r}", 2)
    return size


def _join_token(path: Optional[Path]) -> str:
    """The join token: from --join-token-file, else from $TFCLUSTER_JOIN_TOKEN; never from the command line."""
    if path is None:
        return os.environ.get("TFCLUSTER_JOIN_TOKEN", "").strip()
    if not path.exists():  # used and removed (`tfcluster up` does): a node that joined restarts on its certificate;
        return ""          # one that has none is told to join
    try:
        return load_token(path) or ""
    except TokenError as e:
        fail(f"--join-token-file: {e}", 2)


def _health_check(program: Optional[Path], interval: str):
    """The agent's health check from its flags (None without a program); a program it cannot run is exit 2."""
    if program is None:
        return None
    from tfcluster.daemon.agent.node.health import HealthCheck

    seconds = parse_duration(interval, "--health-check-interval")
    if seconds < 1:
        fail(f"--health-check-interval: expected 1s or more, got {interval!r}", 2)
    program = program.absolute()
    if not program.is_file() or not os.access(program, os.X_OK):
        fail(f"--health-check-program {program}: not an executable file", 2)
    return HealthCheck(program, seconds)
