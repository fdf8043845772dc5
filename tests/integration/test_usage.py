"""Accounting through real daemons: two users with their own certificates run jobs; `tfcluster usage` (table and
--json) and `status` show what they used; the ledger outlives job retention and a coordinator kill -9."""

from __future__ import annotations

import json
import sys
import time

from harness import wait_until

from tfcluster import pki

PY = sys.executable


def as_user(cluster, name: str, *groups: str) -> dict[str, str]:
    """A CLI environment with a person's own certificate (role user), as `tfcluster ca issue` writes it."""
    out = cluster.root / "people" / name
    pki.write_credentials(pki.Authority.load(cluster.ca_dir, with_key=True), out, name, "user", groups)
    return {"TFCLUSTER_TLS_DIR": str(out)}


def usage(cluster, env, *args) -> dict:
    return json.loads(cluster.cli("usage", "--json", *args, env=env, check=True).stdout)


def by_name(rows: list[dict]) -> dict[str, dict]:
    return {r["name"]: r for r in rows}


def test_usage_per_user_and_group_survives_retention_and_a_coordinator_kill_9(make_cluster, tmp_path):
    # Ended jobs are removed at once: what they used stays in the ledger.
    cluster = make_cluster(3.0, "--keep-finished-jobs", "0")
    cluster.start_agent("a", gpus=3)
    alice, bob = as_user(cluster, "alice", "vision"), as_user(cluster, "bob", "vision", "nlp")
    gate = tmp_path / "go"
    short = cluster.cli("start", "--name", "short", "--strategy", "mirrored", "--gpus-per-task", "2", "--",
                        PY, "-c", "import time; time.sleep(2)", env=alice, check=True).stdout.strip()
    long = cluster.cli("start", "--name", "long", "--strategy", "mirrored", "--gpus-per-task", "1", "--", PY,
                       "-c", f"import pathlib, time\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.05)",
                       env=bob, check=True).stdout.strip()
    wait_until(lambda: short not in {j["id"] for j in cluster.status()["jobs"]}, 40, what=f"{short} to end and go")

    report = usage(cluster, bob)  # a user sees everyone's totals
    users, groups = by_name(report["users"]), by_name(report["groups"])
    assert set(users) == {"alice", "bob"} and set(groups) == {"vision", "nlp"}
    assert 2 * 1.5 <= users["alice"]["gpu_seconds"] <= 2 * 15 and users["alice"]["jobs"] == 1
    assert users["bob"]["gpu_seconds"] > 0 and users["bob"]["jobs"] == 1  # running: counted up to now
    assert groups["vision"]["jobs"] == 2 and groups["nlp"]["jobs"] == 1
    assert groups["vision"]["gpu_seconds"] >= users["alice"]["gpu_seconds"] + users["bob"]["gpu_seconds"]
    assert report["until"] - report["since"] == 7 * 86400 and report["horizon_seconds"] == 90 * 86400

    job = cluster.cli("status", long, "--json", env=bob, check=True).stdout
    shown = json.loads(job)["jobs"][0]["usage"]
    assert shown["gpu_seconds"] > 0 and set(shown) == {"gpu_seconds", "cpu_seconds", "peak_rss_bytes"}
    assert "usage: " in cluster.cli("status", long, env=bob, check=True).stdout
    table = cluster.cli("usage", env=alice, check=True).stdout
    for word in ("users", "groups", "alice", "bob", "vision", "nlp", "GPU-HOURS", "CPU-HOURS", "PEAK MEMORY"):
        assert word in table, table

    cluster.coordinator.kill()
    cluster.start_coordinator("--keep-finished-jobs", "0")
    wait_until(lambda: cluster.node_state("a") == "READY", 20, what="the agent to re-register")
    time.sleep(0.5)
    after = by_name(usage(cluster, alice)["users"])
    assert after["alice"] == users["alice"]  # the ledger's entry, as stored
    assert after["bob"]["gpu_seconds"] > users["bob"]["gpu_seconds"]  # still running, still counted

    gate.touch()
    wait_until(lambda: long not in {j["id"] for j in cluster.status()["jobs"]}, 40, what=f"{long} to end and go")
    final = by_name(usage(cluster, alice, "--since", "0")["users"])
    assert final["bob"]["gpu_seconds"] >= after["bob"]["gpu_seconds"] and final["bob"]["jobs"] == 1
    assert by_name(usage(cluster, alice, "--since", "0")["groups"])["vision"]["jobs"] == 2
