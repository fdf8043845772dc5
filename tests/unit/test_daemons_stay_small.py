"""What the daemons and the CLI import: never TensorFlow (the agent must stay small), and the agent
nothing of the coordinator (they share tfcluster.model and tfcluster.wire, nothing else)."""

from __future__ import annotations

import subprocess
import sys


def modules_after(imports: str) -> set[str]:
    code = f"import sys\nimport {imports}\nprint('\\n'.join(sorted(sys.modules)))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(result.stdout.split())


def test_daemons_and_cli_do_not_import_tensorflow():
    loaded = modules_after("tfcluster.cli, tfcluster.daemon.agent.agent, tfcluster.daemon.coordinator.service, "
                           "tfcluster.demo")
    assert sorted(m for m in ("tensorflow", "tf_keras", "keras", "numpy") if m in loaded) == []


def test_the_agent_imports_nothing_of_the_coordinator():
    loaded = modules_after("tfcluster.daemon.agent.agent, tfcluster.daemon.agent.taskrunner, tfcluster.task")
    assert sorted(m for m in loaded if m.startswith("tfcluster.daemon.coordinator")) == []


def test_client_commands_import_no_daemon_web_server_or_ca_code():
    """Every `tfcluster status` pays for what `tfcluster.cli` imports: the daemons, their HTTP server (aiohttp)
    and the CA's cryptography are imported by the commands that use them, not by every command."""
    loaded = modules_after("tfcluster.cli, tfcluster.client")
    assert sorted(m for m in loaded if m.startswith(("tfcluster.daemon", "aiohttp", "cryptography"))
                  or m == "tfcluster.pki") == []
