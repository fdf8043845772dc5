"""A job environment's key names exactly what the build depends on, and the files it is built from stay inside
the workdir."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfcluster.daemon.agent.environments import (EnvironmentProblem, Environments, Request, environment_key,
                                                 read_request, task_environment)
from tfcluster.model import EnvironmentSpec

BASE = Request((("requirements.txt", b"tinypkg==1.0\n"),), False)


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
    assert [n for n, _ in read_request(EnvironmentSpec(project="."), str(tmp_path)).files] == ["pyproject.toml"]
    (tmp_path / "uv.lock").write_text("version = 1\n")
    assert [n for n, _ in read_request(EnvironmentSpec(project="."), str(tmp_path)).files] == ["pyproject.toml",
                                                                                             "uv.lock"]


def test_files_outside_the_workdir_are_refused(tmp_path: Path):
    (tmp_path / "work").mkdir()
    (tmp_path / "secret.txt").write_text("root only\n")
    (tmp_path / "work" / "requirements.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(EnvironmentProblem, match="leaves the workdir"):
        read_request(EnvironmentSpec("requirements.txt"), str(tmp_path / "work"))


def test_requirements_that_read_other_files_are_refused(tmp_path: Path):
    (tmp_path / "requirements.txt").write_text("tinypkg\n-r /etc/shadow\n")
    with pytest.raises(EnvironmentProblem, match=r"requirements.txt:2: .*-r, -c, -e"):
        read_request(EnvironmentSpec("requirements.txt"), str(tmp_path))


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
                                                         str(tmp_path / "work"))
    install = calls.read_text().splitlines()[-1].split()
    assert install[:2] == ["pip", "install"] and ("--no-index" in install) == asked
