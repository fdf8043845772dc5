"""A job environment's key names exactly what the build depends on, and the files it is built from stay inside
the workdir and ask only for packages (an agent that cannot switch users reads them as itself, as here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfcluster.daemon.agent.code.env_request import EnvironmentProblem, Request, environment_key, read_request
from tfcluster.daemon.agent.code.environments import Environments, task_environment
from tfcluster.daemon.agent.tasks.users import TaskUser
from tfcluster.model import EnvironmentSpec

BASE = Request((("requirements.txt", b"tinypkg==1.0\n"),), False)
AGENT = TaskUser(None, None)  # the agent's own user: it cannot switch


def test_the_same_inputs_give_the_same_key():
    assert environment_key(BASE, "cpython-3.11.7-linux-x86_64") == environment_key(
        Request((("requirements.txt", b"tinypkg==1.0\n"),), False), "cpython-3.11.7-linux-x86_64")
    assert environment_key(BASE) == environment_key(BASE)  # this interpreter's own tag


@pytest.mark.parametrize("other, python", [
    (Request((("requirements.txt", b"tinypkg==1.1\n"),), False), "cpython-3.11.7-linux-x86_64"),  # content
    (Request((("requirements.txt", b"tinypkg==1.0\n"),), True), "cpython-3.11.7-linux-x86_64"),   # isolated
    (BASE, "cpython-3.12.1-linux-x86_64"),                                                          # Python version
    (BASE, "cpython-3.11.7-linux-aarch64"),                                                         # platform
    (Request((("pyproject.toml", b"tinypkg==1.0\n"),), False), "cpython-3.11.7-linux-x86_64"),     # which file
    (Request((("requirements.txt", b"tinypkg==1.0\n"), ("uv.lock", b"")), False), "cpython-3.11.7-linux-x86_64"),
])
def test_each_input_changes_the_key(other, python):
    assert environment_key(other, python) != environment_key(BASE, "cpython-3.11.7-linux-x86_64")


def test_inputs_do_not_run_together():
    """Length prefixes: moving bytes from one file's name into its content makes another key."""
    a = Request((("ab", b"c"),), False)
    b = Request((("a", b"bc"),), False)
    assert environment_key(a, "x") != environment_key(b, "x")


def test_a_project_is_its_pyproject_and_its_lock(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert [n for n, _ in read_request(EnvironmentSpec(project="."), str(tmp_path), AGENT).files] == ["pyproject.toml"]
    (tmp_path / "uv.lock").write_text("version = 1\n")
    assert [n for n, _ in read_request(EnvironmentSpec(project="."), str(tmp_path), AGENT).files] == [
        "pyproject.toml", "uv.lock"]


def test_a_project_in_a_folder_is_read_from_it(tmp_path: Path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    request = read_request(EnvironmentSpec(project="app/"), str(tmp_path), AGENT)
    assert request.files == (("pyproject.toml", b"[project]\nname = 'x'\n"),)


@pytest.mark.parametrize("name, why", [("link.txt", "link.txt: is a symbolic link"),
                                       ("../secret.txt", "leaves the workdir"),
                                       ("/etc/passwd", "leaves the workdir")])
def test_files_outside_the_workdir_are_refused(tmp_path: Path, name, why):
    (tmp_path / "work").mkdir()
    (tmp_path / "secret.txt").write_text("root only\n")
    (tmp_path / "work" / "link.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(EnvironmentProblem, match=why):
        read_request(EnvironmentSpec(name), str(tmp_path / "work"), AGENT)


def test_requirements_that_read_other_files_are_refused(tmp_path: Path):
    (tmp_path / "requirements.txt").write_text("tinypkg\n-r /etc/shadow\n")
    with pytest.raises(EnvironmentProblem, match=r"requirements.txt:2: '-r /etc/shadow': reads another file"):
        read_request(EnvironmentSpec("requirements.txt"), str(tmp_path), AGENT)


def test_a_lock_may_name_only_the_operators_index(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "uv.lock").write_text('[[package]]\nname = "tinypkg"\n'
                                      'source = { registry = "https://pypi.org/simple" }\n')
    assert read_request(EnvironmentSpec(project="."), str(tmp_path), AGENT).project
    with pytest.raises(EnvironmentProblem, match=r"uv.lock: package 'tinypkg': comes from the index "
                                                 r"'https://pypi.org/simple', which is not one the node's operator "
                                                 r"named \(https://mirror.example/simple\)"):
        read_request(EnvironmentSpec(project="."), str(tmp_path), AGENT, ("https://mirror.example/simple",))


def test_the_environment_comes_first_on_path():
    env = task_environment(Path("/s/envs/k/venv"), {"PATH": "/usr/bin", "PYTHONHOME": "/x", "A": "1"})
    assert env == {"PATH": "/s/envs/k/venv/bin:/usr/bin", "VIRTUAL_ENV": "/s/envs/k/venv", "A": "1"}


@pytest.mark.parametrize("setting, asked", [("1", True), ("true", True), ("", False), ("0", False)])
def test_uv_no_index_keeps_the_install_to_the_find_links(tmp_path: Path, monkeypatch, setting, asked):
    """uv itself reads no UV_NO_INDEX for `pip install`: the agent says --no-index when its environment sets it."""
    monkeypatch.setenv("UV_NO_INDEX", setting)
    calls = tmp_path / "calls"
    uv = tmp_path / "uv"
    uv.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    uv.chmod(0o755)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "requirements.txt").write_text("tinypkg\n")
    Environments(tmp_path / "state", uv=str(uv)).prepare("j-1", EnvironmentSpec("requirements.txt", True),
                                                         str(tmp_path / "work"), AGENT)
    install = calls.read_text().splitlines()[-1].split()
    assert install[:2] == ["pip", "install"] and ("--no-index" in install) == asked


@pytest.mark.parametrize("flag, environment, indexes", [
    ("", {}, ("https://pypi.org/simple",)),
    ("https://mirror.example/simple", {"UV_INDEX_URL": "https://other.example/simple"},
     ("https://mirror.example/simple",)),
    ("", {"UV_INDEX_URL": "https://mirror.example/simple", "UV_EXTRA_INDEX_URL": "https://a.example https://b.example"},
     ("https://mirror.example/simple", "https://a.example", "https://b.example")),
    ("", {"UV_DEFAULT_INDEX": "https://mirror.example/simple"}, ("https://mirror.example/simple",)),
    ("https://mirror.example/simple", {"UV_NO_INDEX": "1"}, ()),
])
def test_a_lock_may_name_the_indexes_the_operator_set(tmp_path: Path, monkeypatch, flag, environment, indexes):
    for name in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX", "UV_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert Environments(tmp_path, uv="/bin/false", index_url=flag).indexes() == indexes
