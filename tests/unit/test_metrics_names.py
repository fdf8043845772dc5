"""The metric names the daemons serve follow Prometheus conventions, and the shipped Grafana dashboard only
uses names that exist (a renamed metric would otherwise leave an empty panel nobody notices)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tfcluster.daemon.agent.node.metrics import AgentMetrics
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.daemon.coordinator.web.metrics import CoordinatorMetrics
from tfcluster.model import Gpu

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
UNIT_SUFFIXES = ("_seconds", "_bytes", "_ratio", "_watts", "_celsius")


def served(tmp_path) -> dict[str, str]:
    """Every sample name both daemons serve -> its family's type."""
    agent = AgentMetrics(Supervisor(tmp_path, lambda record: None), (Gpu(0, "GPU-x", "Test", 1024),), str(tmp_path))
    names = {}
    for registry in (CoordinatorMetrics(Cluster()).registry, agent.registry):
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for sample in family.samples:
                names[sample.name] = family.type
            names[family.name] = family.type
    return names


def test_names_follow_prometheus_conventions(tmp_path):
    names = served(tmp_path)
    ours = {n: t for n, t in names.items() if n.startswith("tfcluster_")}
    assert len(ours) > 30
    for name, kind in ours.items():
        assert re.fullmatch(r"tfcluster_[a-z0-9_]+", name), name
        if kind == "counter" and name != name.removesuffix("_total"):
            assert names.get(name.removesuffix("_total")) == "counter", name
        assert "_total_" not in name and not name.endswith("_count_total"), name
    for name in ("tfcluster_job_duration_seconds", "tfcluster_rpc_duration_seconds", "tfcluster_disk_free_bytes",
                 "tfcluster_gpu_utilization_ratio", "tfcluster_task_resident_memory_bytes"):
        assert name in names or any(n.startswith(name) for n in names), name


def test_the_grafana_dashboard_uses_only_served_metrics(tmp_path):
    names = served(tmp_path)
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(expressions) > 20
    for expr in expressions:
        for name in re.findall(r"\b((?:tfcluster|process)_[a-z0-9_]+)", expr):
            base, suffix = re.fullmatch(r"(.*?)(_bucket|_sum|_count|_total)?", name).groups()
            kinds = {"_total": "counter", None: None}.get(suffix, "histogram")
            assert name in names or (kinds and names.get(base) == kinds), f"{name} in {expr!r} is not served"
        assert re.search(r'\bjob="\$(coordinator|agent)_job"', expr), f"{expr!r} does not pick its scrape job"
