"""What the daemons and the CLI import: never TensorFlow (the agent must stay small), and the agent
nothing of the coordinator (they share tfcluster.model and tfcluster.wire, nothing else)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def modules_after(imports: str) -> set[str]:
    code = f"import sys\nimport {imports}\nprint('\\n'.join(sorted(sys.modules)))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(result.stdout.split())


def test_daemons_and_cli_do_not_import_tensorflow():
    loaded = modules_after("tfcluster.cli.cluster, tfcluster.cli.coordinator, tfcluster.cli.agent, tfcluster.cli.jobs, tfcluster.cli.misc, "
                           "tfcluster.daemon.agent.agent, tfcluster.daemon.coordinator.rpc.control_service, tfcluster.demo")
    assert sorted(m for m in ("tensorflow", "tf_keras", "keras", "numpy") if m in loaded) == []


def test_the_agent_imports_nothing_of_the_coordinator():
    loaded = modules_after("tfcluster.daemon.agent.agent, tfcluster.daemon.agent.shim.runner, tfcluster.task")
    assert sorted(m for m in loaded if m.startswith("tfcluster.daemon.coordinator")) == []


def test_client_commands_import_no_daemon_web_server_or_ca_code():
    """Every `tfcluster status` pays for what `tfcluster.cli` imports: the daemons, their HTTP server (aiohttp)
    and the CA's cryptography are imported by the commands that use them, not by every command."""
    loaded = modules_after("tfcluster.cli.cluster, tfcluster.cli.jobs, tfcluster.cli.misc, tfcluster.client")
    assert sorted(m for m in loaded if m.startswith(("tfcluster.daemon", "aiohttp", "cryptography"))
                  or m == "tfcluster.pki") == []


def modules_of_command(*argv: str) -> set[str]:
    """What a real `tfcluster ARGV` run has imported when it ends (here against a port nobody listens on)."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: sys.__stderr__.write('\\nMODULES ' + ' '.join(sorted(sys.modules))))\n"
            f"sys.argv = ['tfcluster', *{list(argv)!r}]\n"
            "from tfcluster.cli import main\n"
            "main()\n")
    env = {**os.environ, "TFCLUSTER_COORDINATOR": f"127.0.0.1:{closed_port()}"}
    env.pop("TFCLUSTER_TLS_DIR", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "cannot reach the coordinator" in result.stderr, result.stderr
    return set(result.stderr.rpartition("MODULES ")[2].split())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_status_imports_only_what_it_shows():
    """`tfcluster status` starts at once: no pydantic (typer's value conversion, replaced by quickparams), no
    job spec (TOML), no conversions between the wire and the daemons' model, no other command's module, and no
    rich (its tables are plain columns: columns.py)."""
    loaded = modules_of_command("status")
    unwanted = ("pydantic", "tfcluster.spec", "tomllib", "tomli", "tfcluster.wire", "tfcluster.api.v1.agent_pb2",
                "tfcluster.daemon", "aiohttp", "cryptography", "tfcluster.pki", "rich.live", "tfcluster.cli.coordinator", "tfcluster.cli.agent",
                "tfcluster.cli.cluster", "tfcluster.cli.node", "tfcluster.roles", "rich")
    assert sorted(m for m in loaded if m.startswith(unwanted)) == []


def test_start_imports_no_daemon_or_pydantic():
    loaded = modules_of_command("start", "--name", "x", "--strategy", "mirrored", "--", "true")
    assert "tfcluster.spec" in loaded  # it sends a spec
    unwanted = ("pydantic", "tfcluster.daemon", "aiohttp", "cryptography", "tfcluster.pki", "rich", "hmac")
    assert sorted(m for m in loaded if m.startswith(unwanted)) == []
