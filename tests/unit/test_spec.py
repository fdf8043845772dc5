"""The job spec: TOML and flags -> validated JobSpec; every bad input names the file, the key and what was expected."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from tfcluster.spec import EnvironmentSpec, JobSpec, RestartPolicy, RoleSpec, SpecError, validate
from tfcluster.specfile import load_spec_file, parse_spec, spec_from_flags
from tfcluster.strategies import by_roles as resolve_strategy

# A spec as a user writes one: every table, the evaluator included.
DESIGN_EXAMPLE = '''\
name = "digits"
strategy = "multi_worker_mirrored"
command = ["python", "examples/keras_mwms.py"]
workdir = "."
checkpoint_dir = "/srv/ckpt/digits"
env = { EPOCHS = "5" }

[roles.worker]
count = 2
gpus = 1

[roles.evaluator]
count = 1
gpus = 0

[restart]
max_restarts = 3
'''

BASE = '''\
name = "digits"
strategy = "multi_worker_mirrored"
command = ["python", "train.py"]

[roles.worker]
count = 2
'''


def write(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def spec_error(tmp_path: Path, text: str) -> SpecError:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    err = info.value
    assert str(path) in str(err), f"the file is not named in: {err}"
    assert err.source == str(path)
    return err


def assert_names(err: SpecError, key: str, *expected: str) -> None:
    text = str(err)
    assert err.key == key, f"wrong key {err.key!r} in: {text}"
    assert f": {key}: " in text, f"key {key!r} is not named in: {text}"
    for word in expected:
        assert word in text, f"{word!r} not in: {text}"


# ---- valid specs ------------------------------------------------------------------------------

def test_design_example_parses(tmp_path):
    path = write(tmp_path, DESIGN_EXAMPLE)
    spec = load_spec_file(path)
    assert isinstance(spec, JobSpec)
    assert spec.name == "digits"
    assert spec.strategy == "multi_worker_mirrored"
    assert spec.command == ("python", "examples/keras_mwms.py")
    assert spec.env == {"EPOCHS": "5"}
    assert spec.count("worker") == 2
    assert spec.gpus_for("worker") == 1
    assert spec.count("evaluator") == 1
    assert spec.gpus_for("evaluator") == 0
    assert spec.count("chief") == 0 and spec.count("ps") == 0
    assert spec.restart.max_restarts == 3
    assert spec.training_task_count == 2
    # The evaluator runs the job command when it has none of its own.
    assert spec.command_for("evaluator") == ("python", "examples/keras_mwms.py")
    # workdir "." is the spec file's folder, made absolute; an absolute checkpoint_dir is kept as is.
    assert spec.workdir == str(tmp_path.resolve())
    assert os.path.isabs(spec.workdir)
    assert spec.checkpoint_dir == "/srv/ckpt/digits"


def test_relative_paths_are_taken_from_the_files_folder(tmp_path, monkeypatch):
    sub = tmp_path / "project"
    sub.mkdir()
    text = DESIGN_EXAMPLE.replace('workdir = "."', 'workdir = "code"').replace(
        'checkpoint_dir = "/srv/ckpt/digits"', 'checkpoint_dir = "ckpt/digits"\nmodel_dir = "../models"')
    path = write(sub, text)
    # The process's own working directory must not matter.
    monkeypatch.chdir(tmp_path)
    spec = load_spec_file(Path("project") / "job.toml")
    assert spec.workdir == str((sub / "code").resolve())
    assert spec.checkpoint_dir == str((sub / "ckpt" / "digits").resolve())
    assert spec.model_dir == str((tmp_path / "models").resolve())
    assert path.exists()


def test_missing_workdir_defaults_to_the_files_folder(tmp_path):
    spec = load_spec_file(write(tmp_path, BASE))
    assert spec.workdir == str(tmp_path.resolve())
    assert spec.checkpoint_dir == ""  # unset stays unset (the coordinator picks one per node)


def test_defaults(tmp_path):
    spec = load_spec_file(write(tmp_path, BASE))
    assert spec.restart == RestartPolicy()
    assert spec.gpus == 0 and spec.gpus_for("worker") == 0
    assert spec.role("chief") == RoleSpec()


def test_full_parameter_server_spec(tmp_path):
    spec = load_spec_file(write(tmp_path, '''\
name = "ps-job_1"
strategy = "parameter_server"
command = ["python3", "train.py"]
gpus = 1
env = { A = "x", N = 3 }
stop_grace_seconds = 5
evaluator_deadline_seconds = 60.5

[roles.chief]
env = { B = "y" }
[roles.worker]
count = 2
nodes = ["n1", "n2"]
[roles.ps]
count = 2
gpus = 0
[roles.evaluator]
entrypoint = "mypkg.evals:evaluate"

[restart]
max_restarts = 0
backoff_seconds = 1.5
permanent_exit_codes = [3, 4]
hang_seconds = 120
'''))
    assert spec.strategy == "parameter_server"
    assert [spec.count(r) for r in ("chief", "worker", "ps", "evaluator")] == [1, 2, 2, 1]
    assert spec.gpus_for("chief") == 1 and spec.gpus_for("ps") == 0
    assert spec.role("worker").nodes == ("n1", "n2")
    assert spec.role("evaluator").entrypoint == "mypkg.evals:evaluate"
    assert spec.env == {"A": "x", "N": "3"}
    assert spec.env_for("chief") == {"A": "x", "N": "3", "B": "y"}
    assert spec.restart == RestartPolicy(max_restarts=0, backoff_seconds=1.5, permanent_exit_codes=(3, 4),
                                         hang_seconds=120.0)
    assert spec.stop_grace_seconds == 5.0
    assert spec.evaluator_deadline_seconds == 60.5


def test_role_command_overrides_job_command_and_no_job_command_needed(tmp_path):
    spec = load_spec_file(write(tmp_path, '''\
name = "one"
strategy = "mirrored"
[roles.worker]
count = 1
command = ["python", "w.py"]
'''))
    assert spec.command == ()
    assert spec.command_for("worker") == ("python", "w.py")


# ---- bad input: each names the file, the key and what was expected ----------------------------

def test_unknown_top_level_key(tmp_path):
    err = spec_error(tmp_path, BASE.replace('command =', 'stratgy = "x"\ncommand ='))
    assert_names(err, "stratgy", "unknown key", "strategy")


def test_unknown_role_key(tmp_path):
    err = spec_error(tmp_path, BASE + "gpu = 1\n")
    assert_names(err, "roles.worker.gpu", "unknown key", "gpus", "count")


def test_unknown_role(tmp_path):
    err = spec_error(tmp_path, BASE + "[roles.master]\ncount = 1\n")
    assert_names(err, "roles.master", "unknown role", "chief", "worker", "ps", "evaluator")


def test_unknown_restart_key(tmp_path):
    err = spec_error(tmp_path, BASE + "[restart]\nmax_retries = 2\n")
    assert_names(err, "restart.max_retries", "unknown key", "max_restarts")


@pytest.mark.parametrize("line, key, expected", [
    ('count = "two"', "roles.worker.count", ["expected an integer", "a string", "'two'"]),
    ("count = true", "roles.worker.count", ["expected an integer", "a boolean"]),
    ("count = 1.5", "roles.worker.count", ["expected an integer", "a number"]),
    ("count = -1", "roles.worker.count", ["expected an integer between 0 and 10000", "-1"]),
    ('gpus = "1"', "roles.worker.gpus", ["expected an integer", "a string"]),
    ('command = "python train.py"', "roles.worker.command", ["expected a list of strings", "a string"]),
    ("command = []", "roles.worker.command", ["non-empty command"]),
    ('nodes = "n1"', "roles.worker.nodes", ["expected a list of non-empty strings"]),
    ('nodes = ["n1", "n1"]', "roles.worker.nodes", ["twice"]),
    ('env = ["A=1"]', "roles.worker.env", ["expected a table"]),
])
def test_wrong_types_in_a_role(tmp_path, line, key, expected):
    # The line goes into [roles.worker], replacing its count where it sets one.
    text = BASE.replace("count = 2", line) if line.startswith("count") else BASE + line + "\n"
    err = spec_error(tmp_path, text)
    assert_names(err, key, *expected)


@pytest.mark.parametrize("text, key, expected", [
    ('name = 7\nstrategy = "mirrored"\n', "name", ["expected a string", "an integer"]),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\ngpus = "all"\n[roles.worker]\n', "gpus",
     ["expected an integer", "a string"]),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\nworkdir = 1\n[roles.worker]\n', "workdir",
     ["expected a string"]),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\nroles = 3\n', "roles", ["expected a table"]),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\nrestart = 3\n[roles.worker]\n', "restart",
     ["expected a table"]),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\n[roles]\nworker = 2\n', "roles.worker",
     ["expected a table", "an integer"]),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\n[roles.worker]\n[restart]\nmax_restarts = -1\n',
     "restart.max_restarts", ["between 0 and 1000", "-1"]),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\n[roles.worker]\n[restart]\npermanent_exit_codes = 3\n',
     "restart.permanent_exit_codes", ["expected a list of integers"]),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\n[roles.worker]\n[restart]\npermanent_exit_codes = [0]\n',
     "restart.permanent_exit_codes", ["between 1 and 255", "0"]),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\n[roles.worker]\n[restart]\nbackoff_seconds = "1s"\n',
     "restart.backoff_seconds", ["expected a number", "a string"]),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\nstop_grace_seconds = -1\n[roles.worker]\n',
     "stop_grace_seconds", ["expected a number >= 0"]),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\nenv = { A = [1] }\n[roles.worker]\n', "env.A",
     ["expected a string", "a list"]),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\nenv = { "1BAD" = "v" }\n[roles.worker]\n', "env.1BAD",
     ["environment variable name"]),
])
def test_wrong_types_at_top_level(tmp_path, text, key, expected):
    assert_names(spec_error(tmp_path, text), key, *expected)


def test_two_chiefs(tmp_path):
    err = spec_error(tmp_path, BASE + "[roles.chief]\ncount = 2\n")
    assert_names(err, "roles.chief.count", "at most one chief", "2")


def test_two_evaluators(tmp_path):
    err = spec_error(tmp_path, BASE + "[roles.evaluator]\ncount = 2\n")
    assert_names(err, "roles.evaluator.count", "at most one evaluator")


def test_ps_without_parameter_server(tmp_path):
    err = spec_error(tmp_path, BASE + "[roles.ps]\ncount = 1\n")
    assert_names(err, "roles.ps", "parameter_server", "multi_worker_mirrored")


PS_BASE = '''\
name = "ps"
strategy = "parameter_server"
command = ["python", "train.py"]
'''


@pytest.mark.parametrize("roles, key, expected", [
    ("[roles.chief]\n[roles.worker]\ncount = 2\n", "roles.ps.count", "at least one ps"),
    ("[roles.chief]\n[roles.ps]\ncount = 1\n", "roles.worker.count", "at least one worker"),
    ("[roles.worker]\ncount = 2\n[roles.ps]\ncount = 1\n", "roles.chief.count", "exactly one chief"),
])
def test_parameter_server_needs_chief_workers_and_ps(tmp_path, roles, key, expected):
    assert_names(spec_error(tmp_path, PS_BASE + roles), key, "parameter_server", expected)


def test_no_training_task(tmp_path):
    err = spec_error(tmp_path, 'name = "x"\nstrategy = "multi_worker_mirrored"\ncommand = ["p"]\n'
                               '[roles.worker]\ncount = 0\n[roles.evaluator]\n')
    assert_names(err, "roles", "at least one training task")


@pytest.mark.parametrize("extra", ["", "[roles.evaluator]\ngpus = 0\n"])
def test_no_chief_or_worker_table_means_one_worker(tmp_path, extra):
    spec = load_spec_file(write(tmp_path, 'name = "x"\nstrategy = "mirrored"\ncommand = ["p"]\n' + extra))
    assert spec.count("worker") == 1 and spec.count("chief") == 0
    assert spec.count("evaluator") == (1 if extra else 0)


@pytest.mark.parametrize("strategy", ["mirrored", "central_storage"])
def test_single_task_strategies_reject_two_workers(tmp_path, strategy):
    err = spec_error(tmp_path, BASE.replace("multi_worker_mirrored", strategy))
    assert_names(err, "roles", strategy, "one training task", "2 workers")


def test_mirrored_rejects_chief_plus_worker(tmp_path):
    err = spec_error(tmp_path, BASE.replace("multi_worker_mirrored", "mirrored").replace("count = 2", "count = 1")
                     + "[roles.chief]\n")
    assert_names(err, "roles", "one training task", "1 chief and 1 workers")


def test_mwms_chief_worker_gpu_mismatch(tmp_path):
    err = spec_error(tmp_path, BASE + "gpus = 2\n[roles.chief]\ngpus = 1\n")
    assert_names(err, "roles.chief.gpus", "same GPU count", "chief has 1", "workers have 2")


def test_mwms_chief_inherits_job_gpus(tmp_path):
    spec = load_spec_file(write(tmp_path, BASE.replace('command =', 'gpus = 2\ncommand =') + "[roles.chief]\n"))
    assert spec.gpus_for("chief") == spec.gpus_for("worker") == 2


@pytest.mark.parametrize("table", ["env", "roles.worker.env"])
@pytest.mark.parametrize("var", ["TF_CONFIG", "CUDA_VISIBLE_DEVICES", "TFCLUSTER_X", "TFCLUSTER_JOB_ID"])
def test_reserved_env(tmp_path, table, var):
    if table == "env":
        text = BASE.replace("command =", f'env = {{ {var} = "1" }}\ncommand =')
    else:
        text = BASE + f'env = {{ {var} = "1" }}\n'
    err = spec_error(tmp_path, text)
    assert_names(err, f"{table}.{var}", "set by tfcluster", "cannot be overridden")


def test_tf_use_legacy_keras_may_be_overridden_where_keras_3_works(tmp_path):
    text = BASE.replace("command =", 'env = { TF_USE_LEGACY_KERAS = "0" }\ncommand =')
    text = text.replace('"multi_worker_mirrored"', '"mirrored"').replace("count = 2", "count = 1")
    assert load_spec_file(write(tmp_path, text)).env == {"TF_USE_LEGACY_KERAS": "0"}


@pytest.mark.parametrize("where", ["job", "role"])
def test_keras_3_is_refused_for_multi_worker_mirrored_with_the_fix(tmp_path, where):
    setting = 'env = { TF_USE_LEGACY_KERAS = "0" }\n'
    text = BASE.replace("command =", setting + "command =") if where == "job" else BASE + setting
    key = "env.TF_USE_LEGACY_KERAS" if where == "job" else "roles.worker.env.TF_USE_LEGACY_KERAS"
    assert_names(spec_error(tmp_path, text), key, "Keras 3", "multi_worker_mirrored", "pip install tf-keras",
                 "TF_USE_LEGACY_KERAS=1", "import tf_keras as keras")
    assert load_spec_file(write(tmp_path, text.replace('"0"', '"1"'))).env_for("worker")["TF_USE_LEGACY_KERAS"] == "1"


def test_preemption_signal_and_grace(tmp_path):
    spec = load_spec_file(write(tmp_path, BASE + '[preemption]\nsignal = "usr1"\ngrace_seconds = 90\n'))
    assert (spec.stop_signal, spec.stop_grace_seconds) == ("SIGUSR1", 90.0)
    spec = load_spec_file(write(tmp_path, "stop_grace_seconds = 5\n" + BASE))
    assert (spec.stop_signal, spec.stop_grace_seconds) == ("SIGTERM", 5.0)


@pytest.mark.parametrize("table, key, words", [
    ('signal = "SIGKILL"', "preemption.signal", ["SIGTERM", "SIGUSR1", "'SIGKILL'"]),
    ('signal = 10', "preemption.signal", ["expected a string"]),
    ("grace_seconds = -1", "preemption.grace_seconds", [">= 0"]),
    ("grace = 3", "preemption.grace", ["unknown key", "grace_seconds"]),
])
def test_bad_preemption_table(tmp_path, table, key, words):
    assert_names(spec_error(tmp_path, BASE + f"[preemption]\n{table}\n"), key, *words)


def test_preemption_grace_given_twice(tmp_path):
    err = spec_error(tmp_path, "stop_grace_seconds = 5\n" + BASE + "[preemption]\ngrace_seconds = 9\n")
    assert_names(err, "preemption.grace_seconds", "stop_grace_seconds")


@pytest.mark.parametrize("name", ["Digits", "my job", "-x", "", "a" * 64, "x/y", "é"])
def test_bad_name(tmp_path, name):
    err = spec_error(tmp_path, BASE.replace('name = "digits"', f'name = "{name}"'))
    assert_names(err, "name", "lowercase letters", repr(name))


@pytest.mark.parametrize("name", ["a", "digits-2", "x_y", "0abc", "a" * 63])
def test_good_names(tmp_path, name):
    assert load_spec_file(write(tmp_path, BASE.replace('name = "digits"', f'name = "{name}"'))).name == name


def test_missing_name(tmp_path):
    assert_names(spec_error(tmp_path, BASE.replace('name = "digits"\n', "")), "name", "missing")


def test_bad_strategy(tmp_path):
    err = spec_error(tmp_path, BASE.replace("multi_worker_mirrored", "horovod"))
    assert_names(err, "strategy", "'horovod'", "mirrored", "multi_worker_mirrored", "parameter_server", "auto")


def test_missing_strategy(tmp_path):
    err = spec_error(tmp_path, BASE.replace('strategy = "multi_worker_mirrored"\n', ""))
    assert_names(err, "strategy", "missing", "parameter_server")


def test_missing_command(tmp_path):
    err = spec_error(tmp_path, BASE.replace('command = ["python", "train.py"]\n', ""))
    assert_names(err, "roles.worker.command", "missing", "no command")


def test_missing_command_for_evaluator_only(tmp_path):
    text = ('name = "x"\nstrategy = "multi_worker_mirrored"\n'
            '[roles.worker]\ncommand = ["python", "t.py"]\n[roles.evaluator]\n')
    assert_names(spec_error(tmp_path, text), "roles.evaluator.command", "missing")


def test_parameter_server_workers_and_ps_need_no_command(tmp_path):
    spec = load_spec_file(write(tmp_path, 'name = "x"\nstrategy = "parameter_server"\n'
                                          '[roles.chief]\ncommand = ["python", "c.py"]\n'
                                          '[roles.worker]\n[roles.ps]\n'
                                          '[roles.evaluator]\nentrypoint = "m:f"\n'))
    assert spec.command == () and spec.count("ps") == 1


def test_invalid_toml(tmp_path):
    err = spec_error(tmp_path, 'name = "x\nstrategy = \n')
    assert err.key == ""
    assert "not valid TOML" in str(err)


def test_unreadable_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(SpecError) as info:
        load_spec_file(missing)
    assert str(missing) in str(info.value)
    assert "cannot read" in str(info.value)


def test_directory_is_unreadable(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec_file(tmp_path)
    assert str(tmp_path) in str(info.value) and "cannot read" in str(info.value)


@pytest.mark.parametrize("role", ["chief", "worker"])
def test_entrypoint_on_non_evaluator(tmp_path, role):
    # BASE ends inside [roles.worker]; a chief gets its own table.
    extra = '[roles.chief]\nentrypoint = "m:f"\n' if role == "chief" else 'entrypoint = "m:f"\n'
    err = spec_error(tmp_path, BASE + extra)
    assert_names(err, f"roles.{role}.entrypoint", "only the evaluator")


def test_bad_entrypoint(tmp_path):
    err = spec_error(tmp_path, BASE + '[roles.evaluator]\nentrypoint = "m.f"\n')
    assert_names(err, "roles.evaluator.entrypoint", "module:function", "'m.f'")


def test_evaluator_summary_dir_is_resolved_from_the_files_folder_and_survives_the_wire(tmp_path):
    from tfcluster.wire import spec_from_proto, spec_to_proto
    spec = load_spec_file(write(tmp_path, BASE + '[roles.evaluator]\nsummary_dir = "logs/eval"\n'))
    assert spec.role("evaluator").summary_dir == str(tmp_path / "logs" / "eval")
    assert spec_from_proto(spec_to_proto(spec)).role("evaluator").summary_dir == str(tmp_path / "logs" / "eval")
    assert load_spec_file(write(tmp_path, BASE + "[roles.evaluator]\n")).role("evaluator").summary_dir == ""


def test_summary_dir_on_non_evaluator(tmp_path):
    err = spec_error(tmp_path, BASE + 'summary_dir = "/logs"\n')
    assert_names(err, "roles.worker.summary_dir", "only the evaluator")


def test_parse_spec_names_its_source():
    with pytest.raises(SpecError) as info:
        parse_spec({"name": "x", "strategy": "mirrored", "bogus": 1}, "flags")
    assert str(info.value).startswith("flags: bogus: unknown key")
    with pytest.raises(SpecError) as info:
        parse_spec(["not", "a", "table"])
    assert "<spec>" in str(info.value) and "expected a table" in str(info.value)


# ---- flags ------------------------------------------------------------------------------------

def test_spec_from_flags_round_trip():
    data = spec_from_flags(name="pj", strategy="parameter_server", workers=3, chief=True, ps=2, evaluator=True,
                           gpus_per_task=1, checkpoint_dir="/ckpt", command=["python", "t.py", "--x"],
                           env={"A": "1"}, max_restarts=5)
    spec = parse_spec(data, "flags")
    assert spec.name == "pj" and spec.strategy == "parameter_server"
    assert spec.command == ("python", "t.py", "--x")
    assert [spec.count(r) for r in ("chief", "worker", "ps", "evaluator")] == [1, 3, 2, 1]
    assert spec.gpus_for("worker") == spec.gpus_for("chief") == 1
    assert spec.gpus_for("ps") == 0 and spec.gpus_for("evaluator") == 0
    assert spec.checkpoint_dir == "/ckpt"
    assert spec.env == {"A": "1"}
    assert spec.restart.max_restarts == 5


def test_spec_from_flags_minimal_defaults():
    data = spec_from_flags(name="m", strategy="multi_worker_mirrored", workers=2, chief=False, ps=0,
                           evaluator=False, gpus_per_task=0, checkpoint_dir=None, command=["python", "t.py"])
    spec = parse_spec(data, "flags")
    assert spec.count("worker") == 2 and spec.count("chief") == 0 and spec.count("evaluator") == 0
    assert spec.restart == RestartPolicy()
    assert spec.checkpoint_dir == "" and spec.env == {}


def test_spec_from_flags_is_validated_like_a_file():
    data = spec_from_flags(name="m", strategy="mirrored", workers=2, chief=False, ps=0, evaluator=False,
                           gpus_per_task=0, checkpoint_dir=None, command=["python", "t.py"])
    with pytest.raises(SpecError) as info:
        parse_spec(data, "flags")
    assert info.value.key == "roles"
    data = spec_from_flags(name="m", strategy="multi_worker_mirrored", workers=2, chief=False, ps=0,
                           evaluator=False, gpus_per_task=0, checkpoint_dir=None, command=[])
    with pytest.raises(SpecError) as info:
        parse_spec(data, "flags")
    assert info.value.key == "roles.worker.command"
    data = spec_from_flags(name="m", strategy="multi_worker_mirrored", workers=2, chief=False, ps=0,
                           evaluator=False, gpus_per_task=0, checkpoint_dir=None, command=["p"],
                           env={"TF_CONFIG": "{}"})
    with pytest.raises(SpecError) as info:
        parse_spec(data, "flags")
    assert info.value.key == "env.TF_CONFIG"


# ---- auto -------------------------------------------------------------------------------------

def auto(**roles: int) -> JobSpec:
    spec = parse_spec({"name": "a", "strategy": "auto", "command": ["p"],
                       "roles": {r: {"count": c} for r, c in roles.items()}})
    assert spec.strategy == "auto"
    return spec


def test_resolve_strategy_auto():
    assert resolve_strategy(auto(worker=1)) == "mirrored"
    assert resolve_strategy(auto(chief=1)) == "mirrored"
    assert resolve_strategy(auto(worker=2)) == "multi_worker_mirrored"
    assert resolve_strategy(auto(chief=1, worker=1)) == "multi_worker_mirrored"
    assert resolve_strategy(auto(worker=1, evaluator=1)) == "mirrored"
    assert resolve_strategy(auto(chief=1, worker=2, ps=1)) == "parameter_server"


def test_resolve_strategy_explicit_is_kept():
    spec = parse_spec({"name": "a", "strategy": "central_storage", "command": ["p"], "roles": {"worker": {}}})
    assert resolve_strategy(spec) == "central_storage"


def test_auto_is_validated_as_the_strategy_it_resolves_to():
    # auto + ps is parameter_server: it needs its chief, and workers/ps run the built-in server (no command).
    spec = parse_spec({"name": "a", "strategy": "auto",
                       "roles": {"chief": {"command": ["python", "c.py"]}, "worker": {}, "ps": {}}})
    assert resolve_strategy(spec) == "parameter_server"
    with pytest.raises(SpecError) as info:
        parse_spec({"name": "a", "strategy": "auto", "command": ["p"], "roles": {"worker": {}, "ps": {}}}, "f.toml")
    assert info.value.key == "roles.chief.count" and "parameter_server" in str(info.value)
    # auto with chief + workers is multi_worker_mirrored: the same GPU count everywhere.
    with pytest.raises(SpecError) as info:
        parse_spec({"name": "a", "strategy": "auto", "command": ["p"], "gpus": 1,
                    "roles": {"worker": {"count": 2}, "chief": {"gpus": 2}}})
    assert info.value.key == "roles.chief.gpus"


# ---- where the code comes from, and its environment ----------------------------------------------

def test_a_spec_files_workdir_is_packed_unless_it_says_it_is_shared(tmp_path):
    spec = load_spec_file(write(tmp_path, BASE))
    assert (spec.shared_workdir, spec.code_sha256, spec.environment) == (False, "", EnvironmentSpec())
    shared = load_spec_file(write(tmp_path, "shared_workdir = true\n" + BASE))
    assert shared.shared_workdir
    root = load_spec_file(write(tmp_path, 'workdir = "/"\n' + BASE))
    assert root.shared_workdir, "a whole filesystem is never packed"


def test_a_spec_from_flags_runs_in_the_current_folder_on_shared_storage():
    data = spec_from_flags(name="x", strategy="mirrored", workers=1, chief=False, ps=0, evaluator=False,
                           gpus_per_task=0, checkpoint_dir=None, command=["python3", "train.py"])
    assert parse_spec(data, "flags").shared_workdir


def test_the_environment_table_is_read_and_checked(tmp_path):
    spec = load_spec_file(write(tmp_path, BASE + '\n[environment]\nrequirements = "requirements.txt"\n'
                                               'isolated = true\nproject = "."\n'))
    assert spec.environment == EnvironmentSpec("requirements.txt", True, ".")
    assert_names(spec_error(tmp_path, BASE + '\n[environment]\nisolated = "yes"\n'), "environment.isolated",
                 "true or false")
    assert_names(spec_error(tmp_path, BASE + '\n[environment]\nrequirements = "../req.txt"\n'),
                 "environment.requirements", "inside the workdir")
    assert_names(spec_error(tmp_path, BASE + '\n[environment]\nproject = "/srv/p"\n'), "environment.project",
                 "inside the workdir")
    assert_names(spec_error(tmp_path, BASE + '\n[environment]\npip = ["x"]\n'), "environment.pip", "unknown key")
    assert_names(spec_error(tmp_path, "shared_workdir = 1\n" + BASE), "shared_workdir", "true or false")


def test_a_code_archive_is_named_by_its_sha256_and_never_with_a_shared_workdir(tmp_path):
    spec = load_spec_file(write(tmp_path, BASE))
    good = "sha256:" + "ab" * 32
    assert validate(replace(spec, code_sha256=good)).code_sha256 == good
    for bad in ("ab" * 32, "sha256:" + "AB" * 32, "sha256:12"):
        with pytest.raises(SpecError, match="code_sha256: expected"):
            validate(replace(spec, code_sha256=bad))
    with pytest.raises(SpecError, match="shared_workdir: a job whose workdir is on shared storage ships no code"):
        validate(replace(spec, code_sha256=good, shared_workdir=True))


def test_code_and_environment_go_over_the_wire_and_back(tmp_path):
    from tfcluster import wire

    spec = replace(load_spec_file(write(tmp_path, BASE + '\n[environment]\nrequirements = "r.txt"\n')),
                   code_sha256="sha256:" + "0f" * 32)
    assert wire.spec_from_proto(wire.spec_to_proto(spec)) == spec
    old_client = wire.spec_to_proto(load_spec_file(write(tmp_path, BASE)))
    old_client.ClearField("shared_workdir")
    assert wire.spec_from_proto(old_client).code_sha256 == "", "no archive: the workdir is on shared storage"
