"""`tfcluster coordinator` and `tfcluster agent`: the two daemons."""

from __future__ import annotations

import faulthandler
import os
from pathlib import Path
from typing import Optional

import typer

from tfcluster.auth import TokenError, load_token
from tfcluster.cli.common import app, default_state_dir, fail, parse_duration, parse_size, read_token
from tfcluster.cli.node import MinFreeDiskOpt, RetainBytesOpt, RetainForOpt, retention_policy

MIN_NODE_CERT_SECONDS = 5           # the agent renews at two thirds: shorter would be renewing all the time
MAX_NODE_CERT_SECONDS = 365 * 86400
LogLevelOpt = typer.Option("info", help="debug, info, warning or error.")
LogFormatOpt = typer.Option("text", metavar="text|json",
                            help="text: one line per event (under journald with its priority, without a "
                                 "timestamp); json: one object per line for log collectors.")


def _setup_logging(level: str, fmt: str) -> None:
    from tfcluster.daemon import logformat  # the daemons' own imports are paid by the daemons alone

    try:
        logformat.setup(level, fmt)
    except ValueError as e:
        fail(str(e), 2)
    # A daemon that systemd's watchdog kills (SIGABRT) leaves the stack of every thread in its log: where it hung.
    faulthandler.enable()


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


def _check_trust_flags(tls_dir: Optional[Path], insecure: bool, token: Optional[str]) -> None:
    if insecure and tls_dir is not None:
        fail("--insecure and --tls-dir contradict each other: give one", 2)
    if not insecure and tls_dir is None:
        fail("give --tls-dir DIR (made by `tfcluster ca init --dir DIR`) to serve mutual TLS, or --insecure to "
             "serve plain text to anyone who reaches the port", 2)
    if token and not insecure:
        fail("--token-file goes with --insecure; with TLS certificates take its place", 2)


EtcdCaOpt = typer.Option(None, "--etcd-ca", metavar="FILE",
                         help="With --store etcd://...: the CA that signed the etcd members' certificates "
                              "(etcd is then reached over HTTPS).")
EtcdCertOpt = typer.Option(None, "--etcd-cert", metavar="FILE",
                           help="With --etcd-ca: the client certificate presented to etcd (etcd's --client-cert-auth).")
EtcdKeyOpt = typer.Option(None, "--etcd-key", metavar="FILE", help="The private key of --etcd-cert.")
EtcdInsecureOpt = typer.Option(False, "--etcd-insecure",
                               help="With --store etcd://... and no --etcd-ca: reach etcd over plain HTTP, which "
                                    "is refused otherwise. Anyone who can reach etcd then reads and changes the "
                                    "cluster's state. For tests and throwaway clusters only.")

coordinator_app = typer.Typer(rich_markup_mode=None)
app.add_typer(coordinator_app, name="coordinator")


def _etcd_tls(ca: Optional[Path], cert: Optional[Path], key: Optional[Path], insecure: bool = False):
    from tfcluster.daemon.coordinator.store.etcd_gateway import EtcdTls

    for flag, path in (("--etcd-ca", ca), ("--etcd-cert", cert), ("--etcd-key", key)):
        if path is not None and not path.is_file():
            fail(f"{flag}: {path} is not a file", 2)
    return EtcdTls(str(ca or ""), str(cert or ""), str(key or ""), insecure)


@coordinator_app.callback(invoke_without_command=True)
def coordinator(
    ctx: typer.Context,
    listen: str = typer.Option("0.0.0.0:7070", metavar="HOST:PORT", help="Address to serve gRPC on."),
    state_dir: Optional[Path] = typer.Option(None, help="Where the SQLite state lives "
                                                        "[default: /var/lib/tfcluster/coordinator as root, else ~/.local/state/tfcluster/coordinator]."),
    store: Optional[str] = typer.Option(None, metavar="URL",
                                        help="Where the cluster's state is kept: sqlite:///PATH (a SQLite file), "
                                             "etcd://HOST:PORT,HOST:PORT,...[/PREFIX] (etcd v3, the state "
                                             "under PREFIX, default /tfcluster), or memory:// (forgotten when the "
                                             "coordinator exits) [default: coordinator.sqlite3 in the state dir]."),
    etcd_ca: Optional[Path] = EtcdCaOpt,
    etcd_cert: Optional[Path] = EtcdCertOpt,
    etcd_key: Optional[Path] = EtcdKeyOpt,
    etcd_insecure: bool = EtcdInsecureOpt,
    lost_after: float = typer.Option(3.0, min=0.5, help="Seconds without a heartbeat before a node is LOST."),
    tasks_lost_after: float = typer.Option(
        20.0, min=0.0, help="Seconds a LOST node's tasks are given to come back with their agent (restarted, "
                            "upgraded) before they count as lost and their jobs restart; a peer task failing or a "
                            "stop does not wait for it."),
    forget_lost_nodes_after: str = typer.Option(
        "7d", metavar="DURATION", help="How long a node may stay LOST, with no task of a running job placed there "
                                       "and not drained by an admin, before it is forgotten (its agent registers "
                                       "anew when it comes back; 0: never)."),
    heartbeat_interval: float = typer.Option(1.0, min=0.1, help="Seconds between agent heartbeats."),
    max_heartbeats_per_second: float = typer.Option(
        1000.0, min=0.0, help="In a cluster so large that its heartbeats would come more often, agents heartbeat "
                              "less often, and --lost-after stretches in step (0: no bound)."),
    max_streams_per_caller: int = typer.Option(
        32, min=0, metavar="N", help="The most calls one caller (a certificate's holder) may keep open at once: "
                                     "following jobs or logs (the dashboard's log views too), sending code; the "
                                     "next is refused until one ends (0: no bound)."),
    keep_finished_jobs: int = typer.Option(1000, min=0, help="Ended jobs kept (the oldest are removed first)."),
    keep_finished_for: str = typer.Option("7d", metavar="DURATION",
                                          help="How long an ended job is kept, e.g. 12h or 30d."),
    keep_usage_for: str = typer.Option("90d", metavar="DURATION",
                                       help="How long the usage ledger keeps an ended job's entry (`tfcluster "
                                            "usage`, fair share), whatever --keep-finished-* remove."),
    tls_dir: Optional[Path] = typer.Option(None, metavar="DIR",
                                           help="The cluster CA's directory (`tfcluster ca init`): serve mutual "
                                                "TLS with its coordinator certificate, sign nodes' certificates."),
    join_listen: Optional[str] = typer.Option(None, metavar="HOST:PORT",
                                              help="Where nodes without a certificate join with a token "
                                                   "[default: the --listen port + 1]."),
    node_cert_lifetime: str = typer.Option("24h", metavar="DURATION",
                                           help="How long a node's certificate is valid; agents renew theirs at "
                                                "about two thirds of it."),
    insecure: bool = typer.Option(False, "--insecure",
                                  help="Serve plain text with no certificates: anyone who reaches the port "
                                       "controls the cluster. For tests and throwaway clusters only."),
    token_file: Optional[str] = typer.Option(None, envvar="TFCLUSTER_TOKEN_FILE", metavar="FILE",
                                             help="With --insecure: a shared token calls must carry "
                                                  "(sent in clear text) [env: TFCLUSTER_TOKEN_FILE]."),
    http_listen: Optional[str] = typer.Option(None, metavar="HOST:PORT",
                                              help="Serve Prometheus metrics at /metrics here (HTTPS with TLS: "
                                                   "clients need an admin or viewer certificate) [default: off]."),
    task_uid_range: str = typer.Option("2100000000-2100999999", metavar="FIRST-LAST",
                                       help="UIDs the jobs' tasks run as, one per job and the same on every node "
                                            "(no passwd entry needed); keep it clear of the UIDs and GIDs your "
                                            "hosts and shared storage give to people and services."),
    policy: Optional[Path] = typer.Option(None, metavar="FILE",
                                          help="A policy file (TOML): priority classes, who may use them, and "
                                               "quotas per user and group; reloaded on SIGHUP "
                                               "[default: none: one class, no quotas, first come first placed]."),
    max_code_bytes: str = typer.Option("256M", metavar="SIZE",
                                       help="The largest code archive a job may bring (`tfcluster start` packs "
                                            "the spec's workdir), such as 256M or 1G."),
    code_store_bytes: str = typer.Option("20G", metavar="SIZE",
                                         help="The most all kept code archives may take on the coordinator's "
                                              "disk together; an upload past it is refused."),
    max_code_unpacked_bytes: Optional[str] = typer.Option(
        None, metavar="SIZE", help="The most a code archive's files may add up to unpacked (a sparse file at its "
                                   "full size): an upload past it, or holding anything but files, folders and "
                                   "symbolic links inside its tree, is refused once whole, with the reason "
                                   "[default: 16 times --max-code-bytes]."),
    advertise_address: Optional[str] = typer.Option(
        None, metavar="HOST", help="With --store etcd://...: the host name or IP address agents and clients reach "
                                   "this coordinator at when it leads (standbys name it) [default: the --listen "
                                   "host, or this host's address when it listens on every interface]."),
    log_level: str = LogLevelOpt,
    log_format: str = LogFormatOpt,
) -> None:
    """Run the coordinator: registrations, scheduling, job state."""
    if ctx.invoked_subcommand:  # `tfcluster coordinator migrate-store`: the daemon does not run
        return
    import sqlite3

    from tfcluster.daemon.coordinator.core.model.task_uids import parse_range
    from tfcluster.daemon.coordinator.core.scheduling.policy import PolicyError
    from tfcluster.daemon.coordinator.grpc_server import CoordinatorServer
    from tfcluster.daemon.coordinator.process import serve
    from tfcluster.daemon.coordinator.store.api import Conflict, StoreUrlError
    from tfcluster.daemon.web import HttpError
    from tfcluster.pki import PkiError

    _setup_logging(log_level, log_format)
    try:
        task_uids = parse_range(task_uid_range)
    except ValueError as e:
        fail(f"--task-uid-range: {e}", 2)
    token = read_token(token_file)
    _check_trust_flags(tls_dir, insecure, token)
    code_cap = parse_size(max_code_bytes, "--max-code-bytes")
    code_store_cap = parse_size(code_store_bytes, "--code-store-bytes")
    unpacked_cap = None if max_code_unpacked_bytes is None else \
        parse_size(max_code_unpacked_bytes, "--max-code-unpacked-bytes")  # None: the store's default
    keep_for = parse_duration(keep_finished_for, "--keep-finished-for")
    keep_usage_seconds = parse_duration(keep_usage_for, "--keep-usage-for")
    node_cert_seconds = parse_duration(node_cert_lifetime, "--node-cert-lifetime")
    if not MIN_NODE_CERT_SECONDS <= node_cert_seconds <= MAX_NODE_CERT_SECONDS:
        fail(f"--node-cert-lifetime: expected between {MIN_NODE_CERT_SECONDS}s and {MAX_NODE_CERT_SECONDS // 86400}d, "
             f"got {node_cert_lifetime!r}", 2)
    if heartbeat_interval >= lost_after:
        fail(f"--heartbeat-interval ({heartbeat_interval}) must be shorter than --lost-after ({lost_after})", 2)
    options = dict(state_dir=state_dir or default_state_dir("coordinator"), lost_after_seconds=lost_after,
                   task_grace_seconds=tasks_lost_after,
                   forget_lost_seconds=parse_duration(forget_lost_nodes_after, "--forget-lost-nodes-after"),
                   heartbeat_interval_seconds=heartbeat_interval, max_heartbeats_per_second=max_heartbeats_per_second,
                   max_streams_per_caller=max_streams_per_caller,
                   insecure=insecure, token=token,
                   keep_finished_jobs=keep_finished_jobs, keep_finished_seconds=keep_for,
                   node_cert_seconds=node_cert_seconds, http_listen=http_listen or "", task_uids=task_uids,
                   keep_usage_seconds=keep_usage_seconds, policy_path=policy,
                   max_code_bytes=code_cap, code_store_bytes=code_store_cap, max_code_unpacked_bytes=unpacked_cap)
    if advertise_address and not (store or "").startswith("etcd://"):
        fail("--advertise-address goes with --store etcd://... (where several coordinators run)", 2)
    try:
        if (store or "").startswith("etcd://"):  # several coordinators may share it: one leads at a time
            from tfcluster.daemon.coordinator.ha import runner as ha
            ha.run(options, listen, join_listen or "", tls_dir, store,
                   _etcd_tls(etcd_ca, etcd_cert, etcd_key, etcd_insecure), advertise_address or "")
            return
        serve(CoordinatorServer(listen, tls_dir=tls_dir, join_listen=join_listen or "", store_url=store or "",
                                etcd_tls=_etcd_tls(etcd_ca, etcd_cert, etcd_key, etcd_insecure), **options))
    except PolicyError as e:
        fail(f"--policy: {e}", 2)
    except StoreUrlError as e:
        fail(str(e), 2)
    except Conflict as e:
        fail(f"stopped: another coordinator wrote to the store ({e})")
    except PkiError as e:
        fail(f"--tls-dir: {e}", 2)
    except HttpError as e:
        fail(str(e), 2)
    except (OSError, RuntimeError, sqlite3.Error) as e:
        fail(f"cannot run the coordinator on {listen}: {e}")


@coordinator_app.command("migrate-store")
def migrate_store(
    source: str = typer.Option(..., "--from", metavar="URL",
                               help="The store to copy from, e.g. sqlite:///var/lib/tfcluster/coordinator/"
                                    "coordinator.sqlite3 (its coordinator stopped)."),
    target: str = typer.Option(..., "--to", metavar="URL", help="The store to copy to, e.g. etcd://h1:2379,h2:2379,"
                                                                "h3:2379/tfcluster; it must hold no documents."),
    force: bool = typer.Option(False, "--force", help="Replace the documents the target holds already."),
    etcd_ca: Optional[Path] = EtcdCaOpt,
    etcd_cert: Optional[Path] = EtcdCertOpt,
    etcd_key: Optional[Path] = EtcdKeyOpt,
    etcd_insecure: bool = EtcdInsecureOpt,
) -> None:
    """Copy a stopped coordinator's whole state (jobs, nodes, tokens, removals, usage) into another store."""
    from tfcluster.daemon.coordinator.store.api import StoreUrlError
    from tfcluster.daemon.coordinator.store.copy import TargetNotEmpty, copy_store
    from tfcluster.daemon.coordinator.store.open import open_store

    tls = _etcd_tls(etcd_ca, etcd_cert, etcd_key, etcd_insecure)
    if source == target:
        fail("--from and --to name the same store", 2)
    for flag, url in (("--from", source), ("--to", target)):
        if not url.partition("://")[0] in ("sqlite", "etcd"):
            fail(f"{flag} {url!r}: expected sqlite:///PATH or etcd://HOST:PORT,...[/PREFIX]", 2)
    if source.startswith("sqlite://") and not Path(source.partition("://")[2]).is_file():
        fail(f"--from {source!r}: no such file", 2)
    try:
        stores = [open_store(url, Path("/nonexistent"), tls if url.startswith("etcd://") else None)
                  for url in (source, target)]
    except StoreUrlError as e:
        fail(str(e).replace("--store", "--from" if source in str(e) else "--to"), 2)
    except (OSError, RuntimeError) as e:
        fail(str(e))
    try:
        copied = copy_store(*stores, replace=force)
    except TargetNotEmpty as e:
        fail(str(e))
    except (OSError, RuntimeError) as e:
        fail(f"the copy failed: {e}")
    finally:
        for store in stores:
            store.close()
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(copied.by_kind.items()))
    print(f"copied {copied.documents} documents ({kinds}) from {stores[0].location} to {stores[1].location}")


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

    _setup_logging(log_level, log_format)
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
