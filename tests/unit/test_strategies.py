"""Each strategy profile on its own: the rules of one training style, and `auto` resolved in one place."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tfcluster import strategies as S
from tfcluster.spec import RoleSpec
from tfcluster.specfile import parse_spec


def spec(strategy, **roles):
    table = {r: (v if isinstance(v, dict) else {"count": v}) for r, v in roles.items()}
    return parse_spec({"name": "j", "strategy": strategy, "command": ["p"], "roles": table})


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_mirrored_and_central_storage(name):
    p = S.profile(name)
    assert p.check_roles(spec(name, worker=1)) is None
    assert p.check_roles(spec("multi_worker_mirrored", worker=2))[0] == "roles"
    assert all(p.in_first_wave(t) and not p.must_listen(t) and not p.serves_until_stopped(t)
               for t in ("chief", "worker", "evaluator"))
    assert p.env() == {} and p.restart_scope("worker") == S.GROUP
    assert not p.runs_builtin_server("worker", spec(name, worker=1))


def test_multi_worker_mirrored():
    p = S.profile("multi_worker_mirrored")
    assert p.check_roles(spec("multi_worker_mirrored", worker=3)) is None
    mismatch = replace(spec("multi_worker_mirrored", worker=2), gpus=1,
                       roles={"worker": RoleSpec(count=2), "chief": RoleSpec(count=1, gpus=2)})
    assert p.check_roles(mismatch)[0] == "roles.chief.gpus"
    assert p.restart_scope("chief") == p.restart_scope("worker") == S.GROUP
    assert p.env() == {} and all(p.in_first_wave(t) for t in ("chief", "worker", "evaluator"))


def test_parameter_server():
    p = S.profile("parameter_server")
    s = spec("parameter_server", chief=1, worker=2, ps=1)
    assert p.check_roles(s) is None
    assert p.env() == {"GRPC_FAIL_FAST": "use_caller"}
    assert [t for t in ("chief", "worker", "ps", "evaluator") if not p.in_first_wave(t)] == ["chief"]
    assert [t for t in ("chief", "worker", "ps", "evaluator") if p.must_listen(t)] == ["worker", "ps"]
    assert [t for t in ("chief", "worker", "ps", "evaluator") if p.serves_until_stopped(t)] == ["worker", "ps"]
    assert p.runs_builtin_server("worker", s) and p.runs_builtin_server("ps", s)
    assert not p.runs_builtin_server("chief", s)
    own = parse_spec({"name": "j", "strategy": "parameter_server", "command": ["p"],
                      "roles": {"chief": {}, "worker": {}, "ps": {"command": ["my-ps"]}}})
    assert not p.runs_builtin_server("ps", own)
    assert p.restart_scope("worker") == S.ALONE
    assert p.restart_scope("ps") == p.restart_scope("chief") == ("ps", "chief")


def test_auto_by_roles_and_by_hardware():
    assert S.by_roles(spec("auto", worker=1)) == "mirrored"
    assert S.by_roles(spec("auto", worker=2)) == "multi_worker_mirrored"
    assert S.by_roles(spec("auto", chief=1, worker=1, ps=1)) == "parameter_server"
    two = parse_spec({"name": "j", "strategy": "auto", "command": ["p"], "gpus": 2,
                      "roles": {"worker": {"count": 2, "env": {"W": "1"}}, "evaluator": {"gpus": 0}}})
    # The training GPUs (4) fit on one node: one mirrored worker with all of them; the evaluator stays.
    one = S.resolve(two, {"a": 4, "b": 2})
    assert one.strategy == "mirrored" and one.count("worker") == 1 and one.gpus_for("worker") == 4
    assert one.role("worker").env == {"W": "1"} and one.count("evaluator") == 1
    # No node has 4 free: multi_worker_mirrored across nodes, the roles as asked.
    many = S.resolve(two, {"a": 3, "b": 3})
    assert many.strategy == "multi_worker_mirrored" and many.count("worker") == 2
    assert S.resolve(two).strategy == "multi_worker_mirrored"
    explicit = spec("central_storage", worker=1)
    assert S.resolve(explicit, {"a": 8}) is explicit
