"""Who may read a daemon's /metrics: the cluster's access rules, over HTTPS."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from harness import free_port, scrape, value


def test_metrics_need_a_reader_certificate(make_cluster, tmp_path):
    coordinator_http = f"127.0.0.1:{free_port()}"
    cluster = make_cluster(3.0, "--http-listen", coordinator_http)
    node = cluster.credentials("node", "a")
    files = tmp_path / "node"
    files.mkdir()
    for name, pem in (("ca", node.ca), ("cert", node.cert), ("key", node.key)):
        (files / name).write_bytes(pem)
    for name, pem in (("ca.crt", node.ca), ("client.crt", node.cert), ("client.key", node.key)):
        (files / name).write_bytes(pem)
    assert cluster.cli("status", env={"TFCLUSTER_TLS_DIR": str(files)}).returncode != 0
    with pytest.raises(urllib.error.HTTPError) as refused:
        scrape(f"https://{coordinator_http}/metrics", None)
    assert refused.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as refused:
        scrape(f"https://{coordinator_http}/metrics", {n: str(files / n) for n in ("ca", "cert", "key")})
    assert refused.value.code == 403 and b"node 'a' may not read" in refused.value.read()
    admin = {"ca": str(cluster.admin_dir / "ca.crt"), "cert": str(cluster.admin_dir / "client.crt"),
             "key": str(cluster.admin_dir / "client.key")}
    metrics = scrape(f"https://{coordinator_http}/metrics", admin)
    assert value(metrics, "tfcluster_nodes", state="READY") == 0
    assert value(metrics, "tfcluster_rpc_requests", method="GetStatus", code="PERMISSION_DENIED") >= 1
    assert value(metrics, "tfcluster_rpc_requests", method="CreateJoinToken", code="OK") == 1
    plain = urllib.request.Request(f"http://{coordinator_http}/metrics")
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(plain, timeout=5).read()
