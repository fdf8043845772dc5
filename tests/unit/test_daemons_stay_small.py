"""The daemons and the CLI never import TensorFlow (DESIGN.md: the agent must stay small)."""

from __future__ import annotations

import subprocess
import sys


def test_daemons_and_cli_do_not_import_tensorflow():
    code = ("import sys\n"
            "import tfcluster.cli, tfcluster.daemon.agent.agent, tfcluster.daemon.coordinator.service, tfcluster.demo\n"
            "heavy = sorted(m for m in ('tensorflow', 'tf_keras', 'keras', 'numpy') if m in sys.modules)\n"
            "print(','.join(heavy))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""
