"""The cluster's trust and nodes: `tfcluster ca init|issue` (files, no coordinator needed), `tfcluster token create`
and `tfcluster node remove|drain|resume` (admin calls to the coordinator), and `tfcluster dashboard` (a browser's
way in)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from tfcluster.cli.common import CoordinatorOpt, TlsDirOpt, app, ask, connect, err, fail, out, parse_duration
from tfcluster.errors import ClusterError, NotFound
from tfcluster.model import NODE_NAME_RE, drain_reason_problem
from tfcluster.states import DrainState

DRAIN_POLL_SECONDS = 1.0

ca_app = typer.Typer(no_args_is_help=True, help="The cluster's certificate authority.")
token_app = typer.Typer(no_args_is_help=True, help="Join tokens for new nodes.")
node_app = typer.Typer(no_args_is_help=True, help="The cluster's nodes.")
app.add_typer(ca_app, name="ca")
app.add_typer(token_app, name="token")
app.add_typer(node_app, name="node")

CaDirOpt = typer.Option(..., "--dir", metavar="DIR", help="The CA's directory (ca.crt, ca.key, ...).")


@ca_app.command("init")
def ca_init(
    directory: Path = CaDirOpt,
    san: list[str] = typer.Option([], "--san", metavar="NAME_OR_IP",
                                  help="Another name or IP agents and clients reach the coordinator by "
                                       "(repeatable; this host's names and IPs are always included)."),
) -> None:
    """Create the cluster CA, the coordinator's certificate and an admin's credentials (DIR/admin)."""
    for name in san:
        if not name or not name.isprintable() or len(name) > 253 or any(c.isspace() for c in name):
            fail(f"--san: expected a host name or an IP address, got {name!r}", 2)
    from tfcluster import pki  # the CA's cryptography, for `ca` commands alone

    try:
        ca = pki.init_ca(directory, san)
    except pki.PkiError as e:
        fail(str(e), 2)
    except OSError as e:
        fail(f"--dir {directory}: {e.strerror or e}")
    directory = directory.resolve()
    out.print(f"cluster CA written to {directory}:\n"
              f"  {pki.CA_CERT}, {pki.CA_KEY} (keep the key safe: it makes certificates)\n"
              f"  {pki.SERVER_CERT}, {pki.SERVER_KEY}   tfcluster coordinator --tls-dir {directory}\n"
              f"  admin/                               export TFCLUSTER_TLS_DIR={directory / 'admin'}\n"
              f"CA hash (for `tfcluster agent --ca-hash`): {pki.ca_hash(ca.cert)}", markup=False)


@ca_app.command("issue")
def ca_issue(
    directory: Path = CaDirOpt,
    name: str = typer.Option(..., help="Who the credentials are for (a person or a script)."),
    role: str = typer.Option("admin", help="admin (everything), user (submits, and acts on their own jobs) or "
                                           "viewer (reads status and logs)."),
    group: list[str] = typer.Option([], "--group", help="A group the holder belongs to (repeatable): group "
                                                         "quotas and limits apply to its members."),
    out_dir: Path = typer.Option(..., "--out", metavar="OUTDIR",
                                 help="Where to write ca.crt, client.crt and client.key."),
) -> None:
    """Write credentials for a person or a script: a directory to point --tls-dir at."""
    from tfcluster import pki

    try:
        ca = pki.Authority.load(directory, with_key=True)
        pki.write_credentials(ca, out_dir, name, role, tuple(group))
    except pki.PkiError as e:
        fail(str(e), 2)
    except OSError as e:
        fail(f"--out {out_dir}: {e.strerror or e}")
    groups = f" in {', '.join(sorted(set(group)))}" if group else ""
    out.print(f"{role} credentials for {name!r}{groups} written to {out_dir.resolve()} (valid {pki.PERSON_DAYS} days); "
              f"use them with --tls-dir {out_dir} or TFCLUSTER_TLS_DIR", markup=False)


@token_app.command("create")
def token_create(
    ttl: str = typer.Option("1h", metavar="DURATION", help="How long the token can be used, e.g. 30m, 12h, 7d."),
    node: Optional[str] = typer.Option(None, help="Only a node of this name may join with it."),
    reusable: bool = typer.Option(False, "--reusable", help="Any number of nodes may join with it until it expires."),
    replace: bool = typer.Option(False, "--replace",
                                 help="With --node: the node joining with it takes that name over from its current "
                                      "holder (a reinstalled machine, a lost state dir), whose certificate is refused "
                                      "from then on."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Print a join token for `tfcluster agent --join-token-file FILE` (the coordinator keeps only its hash)."""
    seconds = parse_duration(ttl, "--ttl")
    if seconds == 0:
        fail("--ttl: a token that expires at once lets no node join; give a duration such as 1h", 2)
    if node is not None and not NODE_NAME_RE.fullmatch(node):
        fail(f"--node: expected letters, digits, '.', '_' or '-' (at most 253), got {node!r}", 2)
    if replace and node is None:
        fail("--replace: say which node the token replaces (--node NAME)", 2)
    token, expires = ask(coordinator, tls_dir,
                         lambda cluster: cluster.create_join_token(seconds, node or "", reusable, replace))
    print(token)
    typer.echo(f"expires {time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(expires))}"
               f"{'; reusable' if reusable else '; single use'}{f'; node {node} only' if node else ''}"
               f"{'; takes the name over from its current holder' if replace else ''}", err=True)


@node_app.command("remove")
def node_remove(
    name: str = typer.Argument(..., help="The node to remove."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Remove a node from the cluster: its tasks are lost (their jobs restart elsewhere) and its certificate is
    refused from then on. It can join again only with a new token."""
    _check_node_name(name)
    lost = ask(coordinator, tls_dir, lambda cluster: cluster.remove_node(name))
    out.print(f"node {name} removed" + (f"; {lost} running task(s) lost, their jobs restart elsewhere" if lost else ""),
              markup=False)


@node_app.command("drain")
def node_drain(
    name: str = typer.Argument(..., help="The node to drain."),
    reason: str = typer.Option(..., "--reason", metavar="TEXT",
                               help="Why (shown wherever the node is, with who drained it and since when)."),
    requeue: bool = typer.Option(False, "--requeue",
                                 help="Send the jobs running there back to the queue now, as a preemption: they "
                                      "stop gracefully, are charged no restart, and resume from their "
                                      "checkpoints elsewhere."),
    wait: bool = typer.Option(False, "--wait", help="Return once no task runs on the node any more (DRAINED)."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Take a node out of placement (admins): nothing new is placed there; the jobs running there finish
    there, unless --requeue sends them back to the queue. `tfcluster node resume` undoes it."""
    _check_node_name(name)
    reason = reason.strip()
    problem = drain_reason_problem(reason)
    if problem:
        fail(f"--reason: {problem}", 2)
    with connect(coordinator, tls_dir) as cluster:
        try:
            running, requeued = cluster.drain_node(name, reason, requeue)
        except ClusterError as e:
            fail(str(e), e.exit_code)
        if requeued:
            out.print(f"node {name} draining; {requeued} job(s) sent back to the queue", markup=False)
        elif running:
            out.print(f"node {name} draining; {running} job(s) running there finish there", markup=False)
        else:
            out.print(f"node {name} drained; nothing runs there", markup=False)
        if wait:
            _wait_drained(cluster, name)


def _wait_drained(cluster, name: str) -> None:
    """Polls the node until no task runs there; says how many still do when that changes."""
    said = None
    while True:
        try:
            node = cluster.node(name)
        except NotFound:
            fail(f"node {name} was removed while draining", 1)
        except ClusterError as e:
            fail(str(e), e.exit_code)
        if node.drain is None:
            fail(f"node {name} was resumed while draining", 1)
        if node.drain.state == DrainState.DRAINED:
            out.print(f"node {name} drained", markup=False)
            return
        if node.running_tasks != said:
            said = node.running_tasks
            err.print(f"waiting: {said} task(s) still on {name}", markup=False)
        time.sleep(DRAIN_POLL_SECONDS)


@node_app.command("resume")
def node_resume(
    name: str = typer.Argument(..., help="The drained node."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Let a drained node take new tasks again (admins)."""
    _check_node_name(name)
    was_drained = ask(coordinator, tls_dir, lambda cluster: cluster.resume_node(name))
    out.print(f"node {name} resumed: it takes new tasks" if was_drained else f"node {name} was not drained",
              markup=False)


def _check_node_name(name: str) -> None:
    if not NODE_NAME_RE.fullmatch(name):
        fail(f"NAME: expected letters, digits, '.', '_' or '-' (at most 253), got {name!r}", 2)


@app.command()
def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: {\"checks\": [{name, subject, level, "
                                                       "message, fix}], \"failed\": N}."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Check the cluster end to end (admins): every node, the store, the clocks, and real TCP connects between the
    agents' peer ports and task ranges. One line per check, with the fix for each that failed; exit 1 if any did."""
    checks = ask(coordinator, tls_dir, lambda cluster: cluster.doctor())
    failed = sum(1 for c in checks if c.level == "fail")
    if as_json:
        import json

        print(json.dumps({"checks": [{"name": c.name, "subject": c.subject, "level": c.level, "message": c.message,
                                      "fix": c.fix} for c in checks], "failed": failed}, indent=2))
    else:
        from tfcluster.columns import colour_wanted, paint

        colour, colour_on = {"ok": "green", "warn": "yellow", "fail": "red"}, colour_wanted()
        for c in checks:
            fix = f"\n      fix: {c.fix}" if c.fix and c.level != "ok" else ""
            print(paint(f"{c.level.upper():<4}  {c.name:<11} {c.subject}: {c.message}", colour.get(c.level, ""),
                        colour_on) + fix)
        print(f"{len(checks)} checks, {failed} failed")
    if failed:
        raise typer.Exit(1)


@app.command()
def dashboard(
    job_id: Optional[str] = typer.Argument(None, metavar="[JOB]"),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Print a one-time link that logs a browser in to the coordinator's web dashboard (at JOB's page)."""
    url, expires = ask(coordinator, tls_dir, lambda cluster: cluster.dashboard_link(job_id or ""))
    print(url)
    secure = url.startswith("https:")
    err.print(f"open it within {max(0, expires - time.time()):.0f} s; it works once and gives the browser a "
              f"viewer session for 12 hours" + ("; the browser must trust the cluster CA (import its ca.crt) or "
                                                "be told to accept the coordinator's certificate" if secure else ""),
              markup=False)
