"""A job that holds one node's GPU until stopped: what the elastic tests free to make their job grow."""

from __future__ import annotations

import textwrap
from pathlib import Path

from harness import LocalCluster


def hold_gpu(cluster: LocalCluster, folder: Path, node: str) -> str:
    """Starts a one-GPU job on node (it sleeps, and ends at once when stopped); returns its id once RUNNING."""
    spec = folder / f"hold-{node}.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "hold-{node}"
        strategy = "mirrored"
        command = ["sleep", "600"]
        stop_grace_seconds = 0
        [roles.worker]
        count = 1
        gpus = 1
        nodes = ["{node}"]
    """))
    spec.chmod(0o644)
    job_id = cluster.cli("start", str(spec), check=True).stdout.strip()
    cluster.wait_job(job_id, states=("RUNNING",), timeout=30)
    return job_id
