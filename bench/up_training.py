"""A TensorFlow job on a cluster that `tfcluster up` made (a proof run with figures, not a test: it installs
TensorFlow on every host). Network-namespace hosts running sshd (tests/sshhosts.py): one coordinator host that is
also a node, and HOSTS-1 more nodes. The software comes from a wheelhouse built from this checkout with the `tf`
extra (built beforehand and not timed; the hosts reach no package index). Then `examples/mwms_fit.toml` as
shipped (two MultiWorkerMirroredStrategy workers with Keras fit and BackupAndRestore, and the evaluator), started
from the operator's machine with the admin credentials `up` wrote, must end SUCCEEDED with its evaluation.

Prints the time of `up` (each host installs TensorFlow from the wheelhouse), of the job, and where each task ran.

    python bench/up_training.py [--hosts 2]      (root, sshd, the tf extra's wheels reachable to build once)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from sshhosts import SshHosts, unavailable  # noqa: E402
from up import TFCLUSTER, inventory, run  # noqa: E402  (bench/up.py: the same hosts and inventory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2)
    args = parser.parse_args()
    why = unavailable() if os.geteuid() == 0 else "needs root"
    if why:
        sys.exit(f"cannot run: {why}")
    from tfcluster.bringup.inventory import Software
    from tfcluster.bringup.wheelhouse import wheelhouse

    python = subprocess.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    wheelhouse(Software(extras=("tf",)), python, os.uname().machine)
    names = {f"h{i}": f"10.79.0.{i + 1}" for i in range(args.hosts)}
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-up-tf-") as scratch, \
            SshHosts(Path(scratch), names) as hosts:
        cluster = Path(scratch) / "cluster.toml"
        addresses = list(names.values())  # the coordinator's host is a node too
        cluster.write_text(inventory(hosts.key, addresses[0], addresses, extras=("tf",)))
        up, _ = run(hosts, [TFCLUSTER, "up", str(cluster)])
        admin = {"TFCLUSTER_TLS_DIR": str(Path(scratch) / "cluster.tfcluster" / "ca" / "admin"),
                 "TFCLUSTER_COORDINATOR": f"{names['h0']}:7070"}
        took, out = run(hosts, [TFCLUSTER, "start", str(ROOT / "examples" / "mwms_fit.toml"), "--wait"], admin)
        job_id = out.split()[0] if out.split() else ""
        _, doc = run(hosts, [TFCLUSTER, "status", job_id, "--json"], admin)
        job = json.loads(doc)["jobs"][0]
        run(hosts, [TFCLUSTER, "down", str(cluster)])
    placed = ", ".join(f"{t['type']}:{t['index']} on {t['node']} (attempt {t['attempt']})" for t in job["tasks"])
    evaluation = (job.get("evaluation") or {}).get("latest") or {}
    print(f"{args.hosts} hosts, up with the tf extra from a wheelhouse: {up:.1f} s\n"
          f"examples/mwms_fit.toml: {job['state']} in {took:.1f} s, {job['restarts']} restarts; {placed}\n"
          f"  last evaluation: step {evaluation.get('step')}, {evaluation.get('metrics')}")
    if job.get("last_failure"):
        failure = job["last_failure"]
        print(f"  last failure: {failure.get('task')} on {failure.get('node')}: {failure.get('message')}\n    "
              + "\n    ".join(failure.get("log_tail") or []))
    if job["state"] != "SUCCEEDED":
        sys.exit(1)


if __name__ == "__main__":
    main()
