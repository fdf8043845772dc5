"""etcd's own mutual TLS: a real three-member etcd serving its client and peer URLs over HTTPS and taking only
certificates its CA signed. A coordinator given --etcd-ca/--etcd-cert/--etcd-key serves on it and keeps a job
across a restart; one whose client certificate another CA signed, or that has none, or that does not trust
etcd's certificate, is refused: it exits saying that etcd refused it and why, neither hanging nor with a
traceback. One given no TLS flags does not start: plain HTTP to etcd needs --etcd-insecure."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest

from etcdcluster import EtcdCluster, needs_etcd
from harness import free_port
from tfcluster.demo.etcd import TlsFiles
from tfcluster.pki import Authority

pytestmark = needs_etcd
DAY = datetime.timedelta(days=1)


def write_pair(directory: Path, name: str, key_and_cert: tuple[bytes, bytes]) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    key.write_bytes(key_and_cert[0])
    key.chmod(0o600)
    cert.write_bytes(key_and_cert[1])
    return cert, key


def make_tls(directory: Path, client_name: str = "tfcluster") -> tuple[TlsFiles, Authority]:
    """A CA of etcd's own (made with `cryptography`, as tfcluster's CA is), the members' certificate for
    127.0.0.1 and a client certificate it signed."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = Authority.create()
    (directory / "ca.crt").write_bytes(ca.pem)
    cert, key = write_pair(directory, "member", ca.issue("etcd member", "node", DAY, sans=["127.0.0.1"]))
    client_cert, client_key = write_pair(directory, client_name, ca.issue(client_name, "node", DAY))
    return TlsFiles(directory / "ca.crt", cert, key, client_cert, client_key), ca


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory):
    root = tmp_path_factory.mktemp("etcd-tls")
    tls, _ = make_tls(root / "pki")
    cluster = EtcdCluster(root / "etcd", tls=tls).start_all()
    yield cluster
    cluster.stop_all()


def job_states(cluster) -> dict[str, str]:
    jobs = json.loads(cluster.cli("status", "--all", "--json", check=True).stdout)["jobs"]
    return {j["id"]: j["state"] for j in jobs}


def test_a_coordinator_on_etcd_over_mutual_tls_serves_and_keeps_a_job_across_a_restart(make_cluster, secure_etcd,
                                                                                       etcd_prefix):
    url, flags = secure_etcd.url(etcd_prefix), secure_etcd.tls.coordinator_flags()
    cluster = make_cluster(3.0, "--store", url, *flags)
    cluster.start_agent("a")
    done = cluster.cli("start", "--name", "short", "--strategy", "mirrored", "--wait", "--", "true",
                       check=True).stdout.strip()
    assert job_states(cluster) == {done: "SUCCEEDED"}
    cluster.coordinator.kill()
    cluster.start_coordinator("--store", url, *flags)
    assert job_states(cluster) == {done: "SUCCEEDED"}, "etcd kept the job"
    assert "standing by" in cluster.coordinator.log() and "this coordinator leads" in cluster.coordinator.log()


def refused(secure_etcd, tmp_path: Path, etcd_flags: list[str]) -> subprocess.CompletedProcess:
    """A coordinator started on the TLS etcd with these etcd flags; it must exit within a minute."""
    listen = f"127.0.0.1:{free_port()}"
    return subprocess.run([sys.executable, "-m", "tfcluster.cli", "coordinator", "--insecure", "--listen", listen,
                           "--state-dir", str(tmp_path / "coordinator"), "--store", secure_etcd.url("/refused"),
                           *etcd_flags], capture_output=True, text=True, timeout=60)


def test_a_client_certificate_of_another_ca_is_refused_by_etcd(secure_etcd, tmp_path):
    rogue, _ = make_tls(tmp_path / "rogue", "intruder")
    result = refused(secure_etcd, tmp_path, ["--etcd-ca", str(secure_etcd.tls.ca), "--etcd-cert",
                                             str(rogue.client_cert), "--etcd-key", str(rogue.client_key)])
    assert_refused(result, "etcd ended the handshake: it takes only a client certificate signed by its ca")


def test_no_client_certificate_is_refused_by_etcd(secure_etcd, tmp_path):
    result = refused(secure_etcd, tmp_path, ["--etcd-ca", str(secure_etcd.tls.ca)])
    assert_refused(result, "etcd ended the handshake: it takes only a client certificate signed by its ca")


def test_an_etcd_whose_certificate_another_ca_signed_is_not_trusted(secure_etcd, tmp_path):
    rogue, _ = make_tls(tmp_path / "rogue", "intruder")
    result = refused(secure_etcd, tmp_path, ["--etcd-ca", str(rogue.ca), "--etcd-cert",
                                             str(secure_etcd.tls.client_cert), "--etcd-key",
                                             str(secure_etcd.tls.client_key)])
    assert_refused(result, "etcd's certificate is not signed by the ca given as --etcd-ca")


def test_a_coordinator_given_no_etcd_ca_is_told_etcd_may_serve_https_only(secure_etcd, tmp_path):
    assert_refused(refused(secure_etcd, tmp_path, ["--etcd-insecure"]), "does it serve https only (give --etcd-ca)?")


def test_a_coordinator_given_no_etcd_tls_flags_does_not_start_and_says_what_to_give(secure_etcd, tmp_path):
    result = refused(secure_etcd, tmp_path, [])
    assert result.returncode == 2 and "Traceback" not in result.stderr, (result.returncode, result.stderr)
    [line] = result.stderr.strip().splitlines()
    assert "etcd would be reached over plain HTTP: give --etcd-ca, --etcd-cert and --etcd-key" in line, line
    assert "or --etcd-insecure if you accept that anyone who can reach etcd reads and changes the cluster's " \
           "state" in line, line


def assert_refused(result: subprocess.CompletedProcess, why: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "etcd at 127.0.0.1:" in last and why in last.lower(), result.stderr
