"""`tfcluster coordinator`: the daemon that runs the cluster, and `tfcluster coordinator migrate-store`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tfcluster.cli.common import app, default_state_dir, fail, parse_duration, parse_size, read_token
from tfcluster.cli.daemon_flags import LogFormatOpt, LogLevelOpt, check_trust_flags, setup_logging

MIN_NODE_CERT_SECONDS = 5           # the agent renews at two thirds: shorter would be renewing all the time
MAX_NODE_CERT_SECONDS = 365 * 86400

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

    setup_logging(log_level, log_format)
    try:
        task_uids = parse_range(task_uid_range)
    except ValueError as e:
        fail(f"--task-uid-range: {e}", 2)
    token = read_token(token_file)
    check_trust_flags(tls_dir, insecure, token)
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
