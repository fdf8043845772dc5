"""Who may see and do what with a job (core/access/rules.py): the owner and admins act, viewers read, and another user
sees the job's state, owner and size, never a text its program or spec could have put in."""

from __future__ import annotations

from dataclasses import replace

from coresim import Sim, info, make_spec

from tfcluster import views, wire
from tfcluster.daemon.coordinator.core.access import rules as access
from tfcluster.daemon.coordinator.web.metrics import ModelCollector
from tfcluster.model import Evaluation
from tfcluster.pki import ADMIN, NODE, USER, VIEWER, Identity

SECRET = "hunter2-secret"
ALICE, BOB = Identity(USER, "alice"), Identity(USER, "bob")


def failed_job_of_alice():
    """alice's two-worker job whose worker:1 failed, printing the secret her spec's env held, then restarted."""
    sim = Sim(info("n1", 2), info("n2", 2))
    spec = make_spec(worker=2, gpus=1, env={"API_KEY": SECRET})
    job, actions = sim.c.submit(replace(spec, name="train"), sim.now, owner="alice", groups=("vision",))
    sim.running(job, actions)
    sim.exit(job, "worker:1", 3, message=f"cannot open {SECRET}", log_tail=(f"KeyError: {SECRET}",))
    return job


def test_the_owner_and_admins_act_viewers_read_and_others_are_refused_by_the_owners_name():
    job = failed_job_of_alice()
    assert access.may_act(ALICE, job) and access.may_act(Identity(ADMIN, "root-ish"), job)
    assert access.may_act(None, job), "--insecure: anyone may do anything"
    assert not access.may_act(BOB, job) and not access.may_read(BOB, job)
    assert not access.may_act(Identity(VIEWER, "grafana"), job) and access.may_read(Identity(VIEWER, "grafana"), job)
    assert not access.may_read(Identity(NODE, "n1"), job)
    assert not access.may_act(Identity(USER, ""), replace(job, owner="")), "no owner is no one's job, not everyone's"
    assert access.refusal(job) == f"job {job.id} belongs to alice"
    assert "only an admin" in access.refusal(replace(job, owner=""))


def test_another_users_view_keeps_state_owner_and_size_and_leaks_nothing_the_job_wrote():
    job = failed_job_of_alice()
    full = wire.job_status(job)
    assert SECRET in str(full), "the owner sees the failure as it was"
    seen = access.job_status_for(BOB, wire.job_status)(job)
    assert SECRET not in str(seen) and SECRET not in str(views.job_doc(seen))
    assert all(not t.address and not t.pid and not t.message for t in seen.tasks)
    doc = views.job_doc(seen)
    assert all(t["tf_config"] == "" for t in doc["tasks"]), "TF_CONFIG is not rebuilt from hidden addresses"
    assert (seen.id, seen.state, seen.owner, seen.restarts) == (full.id, full.state, "alice", full.restarts)
    assert [(t.type, t.index, t.node, len(t.gpus), t.state) for t in seen.tasks] == \
        [(t.type, t.index, t.node, len(t.gpus), t.state) for t in full.tasks]
    assert seen.last_failure.task == "worker:1" and not seen.last_failure.log_tail
    for reader in (ALICE, Identity(VIEWER, "grafana"), Identity(ADMIN, "ops"), None):
        assert access.job_status_for(reader, wire.job_status)(job) == full


def test_the_owner_labels_the_evaluation_metric_and_adds_no_series():
    job = failed_job_of_alice()
    job.evaluations.append(Evaluation("/ckpt/ckpt-7", 7, {"accuracy": 0.5}))
    family = next(f for f in ModelCollector(Sim.current.c, lambda: 0.0).collect() if f.name == "tfcluster_evaluation")
    assert {(s.labels["owner"], s.labels["metric"], s.value) for s in family.samples} == \
        {("alice", "step", 7), ("alice", "accuracy", 0.5)}


def test_code_is_its_uploaders_and_code_from_before_owners_is_its_jobs_owners():
    def never_asked():
        raise AssertionError("the jobs are asked only of an archive with no owners recorded")
    owners = frozenset({"alice"})
    assert access.may_use_code(ALICE, owners, never_asked)
    assert not access.may_use_code(BOB, owners, never_asked)
    assert access.may_use_code(Identity(ADMIN, "ops"), owners, never_asked), "an admin uses any code"
    assert access.may_use_code(None, owners, never_asked), "--insecure: anyone may do anything"
    for role in (VIEWER, NODE):
        assert not access.may_use_code(Identity(role, "alice"), owners, never_asked), f"a {role} submits no job"
    assert not access.may_use_code(ALICE, frozenset(), never_asked), "a damaged owners file: admins only"
    assert access.may_use_code(Identity(ADMIN, "ops"), frozenset(), never_asked)
    # Stored before owners were recorded: those whose kept jobs name it, and admins.
    assert access.may_use_code(ALICE, None, lambda: {"alice"})
    assert not access.may_use_code(BOB, None, lambda: {"alice"})
    assert not access.may_use_code(BOB, None, set)
    assert access.may_use_code(Identity(ADMIN, "ops"), None, set)
