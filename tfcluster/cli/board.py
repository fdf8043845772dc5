"""`tfcluster tensorboard JOB [JOB...]`: a one-time link to the coordinator's TensorBoard over jobs' summaries, or
(--local) a TensorBoard served on this machine over a copy of them."""

from __future__ import annotations

import os
import sys
import time
import webbrowser
from pathlib import Path
from typing import Optional

import typer

from tfcluster.cli.common import CoordinatorOpt, TlsDirOpt, app, ask, connect, err, fail
from tfcluster.errors import ClusterError


@app.command()
def tensorboard(
    job_ids: list[str] = typer.Argument(..., metavar="JOB [JOB...]"),
    no_browser: bool = typer.Option(False, "--no-browser", help="Print the URL only; open no browser."),
    local: bool = typer.Option(False, "--local", help="Serve TensorBoard on 127.0.0.1 of this machine over a copy "
                                                      "of the summaries, until interrupted [default: the "
                                                      "coordinator serves it]."),
    logdir: Optional[Path] = typer.Option(None, "--logdir", metavar="DIR",
                                          help="--local: keep the summaries in DIR (kept afterwards) [default: a "
                                               "private temporary dir, removed on exit]."),
    port: int = typer.Option(0, min=0, max=65535, help="--local: TensorBoard's port on 127.0.0.1 [default: a free "
                                                       "one]."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Print a one-time link to a TensorBoard over the jobs' summaries (runs named JOB/TASK), and open it.

    The coordinator serves it on its dashboard's address: a user may open their own jobs only (admins and viewers
    every job). With --local, TensorBoard runs here instead, over a copy kept up to date until interrupted."""
    job_ids = list(dict.fromkeys(job_ids))
    if local:
        _serve_locally(job_ids, logdir, port, not no_browser, coordinator, tls_dir)
        return
    url, expires = ask(coordinator, tls_dir, lambda cluster: cluster.tensorboard_link(job_ids))
    print(url, flush=True)
    err.print(f"open it within {max(0, expires - time.time()):.0f} s; it works once and gives the browser a session "
              f"for 12 hours", markup=False)
    if not no_browser and browser_at_hand():
        webbrowser.open(url)


def browser_at_hand() -> bool:
    """Whether a browser can open here: a graphical session (not a shell over ssh on a headless host)."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _serve_locally(job_ids: list[str], logdir: Optional[Path], port: int, browse: bool, coordinator: Optional[str],
                   tls_dir: Optional[Path]) -> None:
    from tfcluster.summary_mirror import SYNC_SECONDS, SummaryMirror, start_tensorboard

    with connect(coordinator, tls_dir) as cluster:
        mirror = SummaryMirror([cluster.job(job_id) for job_id in job_ids], logdir)
        try:
            mirror.sync()  # refused or unknown jobs fail here, before anything is served
            try:
                url = start_tensorboard(mirror.logdir, port)
            except ImportError:
                fail("the tensorboard package is not installed here (pip install 'tfcluster[tf]')")
            print(url, flush=True)
            err.print(f"TensorBoard over {', '.join(job_ids)} (from {mirror.logdir}); Ctrl-C ends it", markup=False)
            if browse and browser_at_hand():
                webbrowser.open(url)
            _follow(mirror, SYNC_SECONDS)
        except ClusterError as e:
            fail(str(e), e.exit_code)
        except KeyboardInterrupt:
            pass
        finally:
            mirror.close()


def _follow(mirror, every: float) -> None:
    """Brings the logdir up to date every `every` seconds; a coordinator away for a while is waited for."""
    while True:
        time.sleep(every)
        try:
            mirror.sync()
        except ClusterError as e:
            from tfcluster.cluster import transient

            if not transient(e):
                raise
            err.print(f"warning: {e}; retrying", markup=False)
