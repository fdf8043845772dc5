"""The shipped systemd units load in systemd as they are: `systemd-analyze verify` finds no error and no
setting it would ignore, and they are notify services with a watchdog whose main process is tfcluster."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "systemd"
NAMES = ("tfcluster-coordinator.service", "tfcluster-agent.service")

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                reason="systemd-analyze is missing (Debian: apt-get install systemd)")


def complaints(unit: Path) -> list[str]:
    """What `systemd-analyze verify` says about the unit. Its exit status alone is not enough: a setting
    it cannot parse is reported and ignored with status 0, and the unit would run without it."""
    # The installed name, so that the output names it; ExecStart's /bin/sh must exist, tfcluster need not
    # (the shell looks it up on PATH when the unit starts). The env file is not read by verify.
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True,
                            text=True, timeout=60)
    said = [line for line in (result.stdout + result.stderr).splitlines() if unit.name in line]
    return said + ([f"exit status {result.returncode}"] if result.returncode else [])


def service_settings(unit: Path) -> dict[str, str]:
    settings, section = {}, ""
    for line in unit.read_text().replace("\\\n", " ").splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key] = value
    return settings


@pytest.mark.parametrize("name", NAMES)
def test_the_unit_verifies_cleanly(name, tmp_path):
    copy = tmp_path / name
    shutil.copy(UNITS / name, copy)
    assert complaints(copy) == []


@pytest.mark.parametrize("name", NAMES)
def test_the_unit_is_a_notify_service_with_a_watchdog_and_tfcluster_as_its_main_process(name):
    settings = service_settings(UNITS / name)
    assert settings["Type"] == "notify" and settings["NotifyAccess"] == "main"
    assert settings["WatchdogSec"] == "30s"
    # NotifyAccess=main takes messages from the main process only: the shell must become tfcluster.
    assert settings["ExecStart"].startswith("/bin/sh -c 'exec tfcluster ")
    assert settings["Restart"] == "on-failure", "a watchdog timeout counts as a failure and restarts it"


def test_a_setting_systemd_would_ignore_is_caught(tmp_path):
    """verify exits 0 on a misspelt value; the check above must still see it."""
    broken = tmp_path / NAMES[1]
    broken.write_text((UNITS / NAMES[1]).read_text().replace("WatchdogSec=30s", "WatchdogSec=30 seconds later"))
    said = complaints(broken)
    assert len(said) == 1 and "Failed to parse sec value" in said[0], said
