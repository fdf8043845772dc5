"""The committed generated modules in tfcluster/api/v1 are exactly what protos/ generates."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_matches_protos(tmp_path):
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools (the dev extra) regenerates the API")
    # In a subprocess: protoc and an already imported TensorFlow do not share a process well.
    subprocess.run([sys.executable, str(ROOT / "scripts" / "genproto.py"), str(tmp_path)], check=True,
                   capture_output=True)
    fresh = {p.name: p.read_text() for p in tmp_path.iterdir()}
    committed_dir = ROOT / "tfcluster" / "api" / "v1"
    committed = {p.name: p.read_text() for p in committed_dir.iterdir() if p.is_file() and p.suffix in (".py", ".pyi")}
    assert sorted(committed) == sorted(fresh), "generated file set differs: run `make protos`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"out of date with protos/: {stale}; run `make protos` and commit"


def test_generated_modules_import_under_the_package():
    from tfcluster.api.v1 import agent_pb2_grpc, control_pb2_grpc, types_pb2
    assert types_pb2.DESCRIPTOR.package == "tfcluster.v1"
    assert hasattr(agent_pb2_grpc, "AgentServiceStub") and hasattr(control_pb2_grpc, "ControlServiceStub")
    assert "tfcluster.v1" not in sys.modules, "generated code must import tfcluster.api.v1, not tfcluster.v1"
