"""What the preemption tests and bench/preemption_save.py share: a coordinator whose policy has a preemptible
`low` class and a `high` one, two agents with one (pretend) GPU each (the `cluster` fixture, or
preemption_cluster), a 2-worker MultiWorkerMirroredStrategy victim on both GPUs and a one-GPU preemptor of the
high class."""

from __future__ import annotations

import contextlib
import sys
import textwrap
from pathlib import Path

import pytest

from harness import ROOT, LocalCluster

POLICY = """
[classes]
low = { value = 10, preemptible = true }
high = { value = 100, preemptible = false }

[defaults]
class = "low"
max_class = "high"
"""
AGENTS = {"a": {"gpus": 1}, "b": {"gpus": 1}}
# The victim's program per mode, and the signal its spec asks for: save-first watches SIGUSR1 through
# task.preemption_handler; plain (Keras fit with BackupAndRestore each epoch) gets the default SIGTERM.
VICTIMS = {"save-first": ("mwms_preemption.py", "SIGUSR1"), "plain": ("mwms_fit.py", "SIGTERM")}


@contextlib.contextmanager
def preemption_cluster(root: Path):
    """A started coordinator with POLICY and the two one-GPU agents, torn down afterwards."""
    cluster = LocalCluster(root=root)
    try:
        (root / "policy.toml").write_text(POLICY)
        cluster.start_coordinator("--policy", str(root / "policy.toml"))
        cluster.start_agents(AGENTS)
        yield cluster
    finally:
        cluster.teardown()


@pytest.fixture
def cluster(tmp_path_factory):
    """preemption_cluster, for a test."""
    with preemption_cluster(tmp_path_factory.mktemp("preemption")) as started:
        yield started


def victim_spec(folder: Path, mode: str, grace: float, epochs: int, step_pause: float = 0.05) -> Path:
    """The low-class victim of a mode (VICTIMS) on both nodes' GPUs, its checkpoints under folder. Both programs
    pause step_pause seconds after each step, so that both modes train at the same pace, and not between epochs:
    a pause there would be time in which a stop loses nothing even without saving first."""
    program, stop_signal = VICTIMS[mode]
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o777)  # the job's tasks run as a UID of their own and make their checkpoint dir here
    spec = folder / "victim.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "victim"
        strategy = "multi_worker_mirrored"
        priority = "low"
        workdir = "{ROOT / 'examples'}"
        checkpoint_dir = "{folder / 'ckpt'}"
        command = ["{sys.executable}", "{program}"]
        env = {{ EPOCHS = "{epochs}", STEP_PAUSE_SECONDS = "{step_pause}" }}
        [preemption]
        signal = "{stop_signal}"
        grace_seconds = {grace}
        [roles.worker]
        count = 2
        gpus = 1
    """))
    return spec


def preemptor_spec(folder: Path, seconds: float = 2) -> Path:
    """A high-class job that needs one GPU and sleeps for `seconds`."""
    spec = folder / "preemptor.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "urgent"
        strategy = "mirrored"
        priority = "high"
        command = ["{sys.executable}", "-c", "import time; time.sleep({seconds})"]
        [roles.worker]
        gpus = 1
    """))
    return spec
