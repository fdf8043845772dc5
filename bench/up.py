"""What `tfcluster up` costs against the floor of SSH itself (a benchmark, not a test): HOSTS network-namespace
hosts, each running sshd (tests/sshhosts.py), one coordinator and HOSTS-1 agents. Measured in the same run: one
bare SSH round trip to every host in parallel (`ssh HOST true`, a new connection each, as `up` makes), the first
`up` (software from a wheelhouse with extras = [], built beforehand and not timed), and a second `up` that changes
nothing. Prints each and its ratio to the floor; writes bench/up.json.

    python bench/up.py [--hosts 16]      (root, sshd; every host installs a virtualenv: fewer hosts on a small machine)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from sshhosts import SSH_OPTIONS, SshHosts, unavailable  # noqa: E402

TFCLUSTER = str(Path(sys.executable).parent / "tfcluster")


def inventory(key: Path, coordinator: str, nodes: list[str], extras: tuple[str, ...] = ()) -> str:
    """The cluster.toml of one coordinator and those nodes. The hosts share one network namespace
    (tests/privatehosts.py), so each node gets task ports of its own, as it may not need on a machine of its own."""
    options = ", ".join(f'"{o}"' for o in SSH_OPTIONS)
    listed = ", ".join(f'"{e}"' for e in extras)
    text = (f'[ssh]\nidentity_file = "{key}"\noptions = [{options}]\n[software]\nextras = [{listed}]\n'
            f'[[coordinators]]\nhost = "{coordinator}"\n')
    return text + "".join(f'[[nodes]]\nhost = "{a}"\ngpus = 0\nport_range = "{22000 + 100 * i}-{22099 + 100 * i}"\n'
                          for i, a in enumerate(nodes))


def run(hosts: SshHosts, argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Seconds the operator's command took, and what it printed; exits naming it when it fails."""
    started = time.monotonic()
    done = hosts.operator(argv, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1", **(env or {})})
    if done.returncode:
        sys.exit(f"{' '.join(argv[:3])} failed:\n{done.stdout}{done.stderr}")
    return time.monotonic() - started, done.stdout


def timed(hosts: SshHosts, argv: list[str]) -> float:
    return run(hosts, argv)[0]


def ssh_floor(hosts: SshHosts, addresses: list[str]) -> float:
    options = [arg for o in SSH_OPTIONS for arg in ("-o", o)]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(lambda a: timed(hosts, ["ssh", "-i", str(hosts.key), *options, f"root@{a}", "true"]),
                      addresses))
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    args = parser.parse_args()
    why = unavailable() if os.geteuid() == 0 else "needs root"
    if why:
        sys.exit(f"cannot run: {why}")
    from tfcluster.bringup.inventory import Software
    from tfcluster.bringup.wheelhouse import wheelhouse

    python = subprocess.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    wheelhouse(Software(extras=()), python, os.uname().machine)
    names = {f"h{i}": f"10.78.{i // 250}.{i % 250 + 1}" for i in range(args.hosts)}
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-up-") as scratch, \
            SshHosts(Path(scratch), names) as hosts:
        cluster = Path(scratch) / "cluster.toml"
        addresses = list(names.values())
        cluster.write_text(inventory(hosts.key, addresses[0], addresses[1:]))
        floor = ssh_floor(hosts, list(names.values()))
        first = timed(hosts, [TFCLUSTER, "up", str(cluster)])
        second = timed(hosts, [TFCLUSTER, "up", str(cluster)])
        floor_after = ssh_floor(hosts, list(names.values()))
        timed(hosts, [TFCLUSTER, "down", str(cluster)])
    floor = min(floor, floor_after)
    result = {"hosts": args.hosts, "ssh_round_trip_all_hosts_s": round(floor, 3), "first_up_s": round(first, 2),
              "second_up_s": round(second, 2), "first_up_ratio": round(first / floor, 1),
              "second_up_ratio": round(second / floor, 1)}
    print(f"{args.hosts} hosts: one bare ssh round trip to each, in parallel: {floor:.2f} s\n"
          f"  first up (install, certificates, units, join, READY): {first:.1f} s = {first / floor:.0f}x\n"
          f"  second up (no change):                                 {second:.2f} s = {second / floor:.1f}x")
    (ROOT / "bench" / "up.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
