"""The launcher's module path before 0.8 (`python -m tfcluster.daemon.agent.launcher SOCKET_FD`), kept for the
command lines of earlier releases: the launcher itself is tasks/launcher.py."""

import sys

from tfcluster.daemon.agent.tasks.launcher import ForkedShim, Launcher, main, serve  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
