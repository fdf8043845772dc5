"""A job's code goes to a real coordinator with `tfcluster start`: sent once, ignored files left out, an
over-cap tree refused with its largest files, one that unpacks to more than the coordinator's cap refused
once uploaded, an upload that was cut off taken up where it stopped."""

from __future__ import annotations

import hashlib
import os
import re
import tarfile

import grpc
import pytest

from tfcluster import codepack
from tfcluster.api.v1 import control_pb2_grpc, types_pb2
from tfcluster.errors import ClusterError

CAP = "2M"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from harness import LocalCluster
    c = LocalCluster(root=tmp_path_factory.mktemp("code"))
    try:
        c.start_coordinator("--max-code-bytes", CAP)
        c.start_agents({"n1": {}})
        yield c
    finally:
        c.teardown()


def workdir(root, files: dict[str, bytes], name: str = "shipped"):
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    (root / "job.toml").write_text(f'name = "{name}"\nstrategy = "mirrored"\ncommand = ["python3", "train.py"]\n')
    return root / "job.toml"


def archives(cluster) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (cluster.root / "coordinator" / "code").glob("*.tar.gz")}


def test_sent_once_without_what_git_ignores(cluster, tmp_path):
    spec = workdir(tmp_path / "w", {"train.py": b"print('trained')\n", ".gitignore": b"data/\n",
                                    "data/big.bin": os.urandom(5_000_000), ".git/objects/x": os.urandom(100_000)})
    before = archives(cluster)
    first = cluster.cli("start", "--wait", str(spec), check=True)
    line = re.search(r"code: 3 files, (\S+ \S+), (sha256:[0-9a-f]{12})\.\.\., uploaded", first.stderr)
    assert line, first.stderr
    new = {name: size for name, size in archives(cluster).items() if name not in before}
    assert len(new) == 1 and list(new.values())[0] < 10_000, "the ignored 5 MB and .git were not sent"
    with tarfile.open(cluster.root / "coordinator" / "code" / next(iter(new))) as tar:
        assert sorted(tar.getnames()) == [".gitignore", "job.toml", "train.py"]
    assert next(iter(new)).startswith(line.group(2)[7:])
    again = cluster.cli("start", str(spec), check=True)  # remembered: not even packed again
    assert f"{line.group(2)}..., already on the cluster" in again.stderr
    (tmp_path / "w" / "train.py").touch()  # packed again: the same bytes, the same archive
    again = cluster.cli("start", str(spec), check=True, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert f"{line.group(2)}..., already on the cluster" in again.stderr
    # The job the cached archive names runs to its end (queried at once it may still be launching).
    assert cluster.wait_job(again.stdout.strip())["state"] == "SUCCEEDED"


def test_an_over_cap_tree_is_refused_with_its_largest_files(cluster, tmp_path):
    spec = workdir(tmp_path / "w", {"train.py": b"", "data/big.bin": os.urandom(3_000_000),
                                    "data/mid.bin": os.urandom(200_000)}, name="big")
    before = archives(cluster)
    result = cluster.cli("start", str(spec))
    assert result.returncode == 2, result.stderr
    assert "code: 3.2 MB is over the coordinator's cap of 2 MiB; largest: data/big.bin 3.0 MB, " \
           "data/mid.bin 200 kB" in result.stderr
    assert archives(cluster) == before and not result.stdout.strip()


def test_an_archive_past_the_unpacked_cap_is_refused_once_uploaded_and_the_cluster_goes_on(cluster, tmp_path):
    spec = workdir(tmp_path / "w", {"train.py": b"print('trained')\n"}, name="sparse")
    with open(tmp_path / "w" / "zeros.bin", "wb") as f:  # 40 MiB that take no disk and pack to a few kB
        os.truncate(f.fileno(), 40 << 20)
    before = archives(cluster)
    result = cluster.cli("start", str(spec))
    assert result.returncode == 2, result.stderr
    assert re.search(r"code: upload failed: sha256:[0-9a-f]{12}\.\.\.: unpacks to 41\.9 MB or more \('zeros\.bin' "
                     r"alone is 41\.9 MB\), over this coordinator's cap of 32 MiB \(--max-code-unpacked-bytes\)",
                     result.stderr), result.stderr
    assert archives(cluster) == before and not list((cluster.root / "coordinator" / "code").glob("*.part"))
    assert not result.stdout.strip(), "no job was submitted"
    (tmp_path / "w" / "zeros.bin").unlink()
    again = cluster.cli("start", str(spec), check=True)
    assert re.search(r"code: 2 files, .*, uploaded", again.stderr), again.stderr
    assert cluster.job(again.stdout.strip())["state"] in ("PENDING", "STARTING", "RUNNING", "SUCCEEDED")


def test_plan_sends_no_code(cluster, tmp_path):
    spec = workdir(tmp_path / "w", {"train.py": os.urandom(1000)}, name="planned")
    before = archives(cluster)
    assert cluster.cli("plan", str(spec), check=True).returncode == 0
    assert archives(cluster) == before


def test_an_interrupted_upload_goes_on_where_it_stopped(cluster, tmp_path):
    spec = workdir(tmp_path / "w", {"train.py": b"print()\n", "weights.bin": os.urandom(1_500_000)}, name="resumed")
    archive = codepack.pack(spec.parent)
    try:
        data = archive.path.read_bytes()
        stub = control_pb2_grpc.ControlServiceStub(cluster.channel())
        first = types_pb2.CodeChunk(sha256=archive.sha256, size=archive.size, offset=0, data=data[:1 << 20])
        with pytest.raises(grpc.RpcError) as cut:  # the connection "broke" after one chunk
            stub.UploadCode(iter([first]), timeout=30)
        assert cut.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "send the rest" in cut.value.details()
        with cluster.client() as client:
            held = client.code_status(archive.sha256, archive.size)
            assert (held.complete, held.received, held.max_bytes) == (False, 1 << 20, 2 << 20)
            positions: list[int] = []
            client.upload_code(archive.path, archive.sha256, archive.size, held.received, positions.append)
            assert positions == [archive.size], "only the rest was sent"
            assert client.code_status(archive.sha256, archive.size).complete
        stored = cluster.root / "coordinator" / "code" / f"{archive.sha256[7:]}.tar.gz"
        assert "sha256:" + hashlib.sha256(stored.read_bytes()).hexdigest() == archive.sha256
    finally:
        archive.remove()
    result = cluster.cli("start", str(spec), check=True)
    assert "already on the cluster" in result.stderr


def test_a_job_naming_code_the_coordinator_lacks_is_refused(cluster, tmp_path):
    from dataclasses import replace

    from tfcluster.specfile import load_spec_file
    spec = load_spec_file(workdir(tmp_path / "w", {"train.py": b""}, name="lacking"))
    with cluster.client() as client, pytest.raises(ClusterError) as refused:
        client.submit(replace(spec, code_sha256="sha256:" + "e" * 64))
    assert refused.value.status == grpc.StatusCode.FAILED_PRECONDITION
    assert f"code sha256:{'e' * 64} is not on the coordinator" in str(refused.value)
