"""`tfcluster tensorboard JOB [JOB...]`: a TensorBoard over jobs' summaries, served on this machine."""

from __future__ import annotations

import time
import webbrowser
from pathlib import Path
from typing import Optional

import typer

from tfcluster.cli.common import CoordinatorOpt, TlsDirOpt, app, connect, err, fail
from tfcluster.errors import ClusterError


@app.command()
def tensorboard(
    job_ids: list[str] = typer.Argument(..., metavar="JOB [JOB...]"),
    no_browser: bool = typer.Option(False, "--no-browser", help="Print the URL only; open no browser."),
    logdir: Optional[Path] = typer.Option(None, "--logdir", metavar="DIR",
                                          help="Keep the summaries in DIR (kept afterwards) [default: a private "
                                               "temporary dir, removed on exit]."),
    port: int = typer.Option(0, min=0, max=65535, help="TensorBoard's port on 127.0.0.1 [default: a free one]."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """Serve a TensorBoard over the jobs' summaries (runs named JOB/TASK), kept up to date until interrupted.

    The summaries come from the coordinator, which lets a user read only their own jobs' (admins and viewers
    every job's); TensorBoard listens on 127.0.0.1 of this machine."""
    from tfcluster.summary_mirror import SYNC_SECONDS, SummaryMirror, start_tensorboard

    with connect(coordinator, tls_dir) as cluster:
        mirror = SummaryMirror([cluster.job(job_id) for job_id in dict.fromkeys(job_ids)], logdir)
        try:
            mirror.sync()  # refused or unknown jobs fail here, before anything is served
            try:
                url = start_tensorboard(mirror.logdir, port)
            except ImportError:
                fail("the tensorboard package is not installed here (pip install 'tfcluster[tf]')")
            print(url, flush=True)
            err.print(f"TensorBoard over {', '.join(job_ids)} (from {mirror.logdir}); Ctrl-C ends it", markup=False)
            if not no_browser:
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
