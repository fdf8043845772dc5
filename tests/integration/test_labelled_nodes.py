"""Node labels with real processes: agents started with --label, a role asking for labels lands only on the node
holding them, waits while that node is busy though another has room, and a label nobody has is named."""

from __future__ import annotations

import json
import sys
import textwrap

PY = sys.executable


def spec_file(tmp_path, name: str, labels: list[str], gpus: int = 0, seconds: float = 0.5):
    path = tmp_path / f"{name}.toml"
    path.write_text(textwrap.dedent(f"""
        name = "{name}"
        strategy = "multi_worker_mirrored"
        command = ["{PY}", "-c", "import time; time.sleep({seconds})"]
        gpus = {gpus}
        [roles.worker]
        count = 2
        labels = {json.dumps(labels)}
    """))
    return path


def test_a_labelled_role_lands_only_on_the_labelled_agent_and_a_missing_label_is_named(make_cluster, tmp_path):
    cluster = make_cluster()
    cluster.start_agents({"plain": {"gpus": 2}, "fast": {"gpus": 2, "extra": ["--label", "a100", "--label", "ib"]}})
    nodes = {n["name"]: n for n in cluster.status()["nodes"]}
    assert nodes["fast"]["labels"] == ["a100", "ib"] and nodes["plain"]["labels"] == []
    table = cluster.cli("status", check=True).stdout
    assert "LABELS" in table and "a100,ib" in table

    busy = cluster.cli("start", str(spec_file(tmp_path, "busy", ["a100"], gpus=1, seconds=4)), check=True)
    job_id = busy.stdout.strip()
    waiting = cluster.cli("start", str(spec_file(tmp_path, "waiting", ["a100", "ib"], gpus=1)), check=True)
    waiting_id = waiting.stdout.strip()
    job = cluster.job(waiting_id)
    assert job["state"] == "PENDING", "plain has 2 free GPUs but not the labels"
    assert "waiting for resources" in job["message"]
    assert {t["node"] for t in cluster.job(job_id)["tasks"]} == {"fast"}
    assert cluster.wait_job(job_id)["state"] == "SUCCEEDED"
    done = cluster.wait_job(waiting_id)
    assert done["state"] == "SUCCEEDED" and {t["node"] for t in done["tasks"]} == {"fast"}

    nobody = spec_file(tmp_path, "nobody", ["h100"])
    plan = cluster.cli("plan", str(nobody))
    assert "roles.worker.labels: no ready node has h100 (labels there: a100, ib)" in plan.stdout + plan.stderr
    refused = cluster.cli("start", str(nobody))
    assert refused.returncode == 1 and "roles.worker.labels: no ready node has h100" in refused.stderr
    bad = cluster.cli("start", str(spec_file(tmp_path, "bad", ["H100"])))
    assert bad.returncode == 2 and "roles.worker.labels: expected labels of" in bad.stderr
