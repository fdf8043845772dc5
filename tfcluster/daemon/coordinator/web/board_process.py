"""One TensorBoard over a logdir, served on a UNIX socket: the process the coordinator starts for a board
(boards.py), as `python -m tfcluster.daemon.coordinator.web.board_process LOGDIR SOCKET PATH_PREFIX`.

It is TensorBoard's own WSGI application (the `tensorboard` package, its default plugins) behind werkzeug's
threaded server. The socket lies in a folder only the coordinator's user may enter (the board's own, which it
removes as it ends), so the board is reachable through the dashboard's access rules alone, never straight from
another user of the host as a loopback port is.

TensorBoard uses TensorFlow for its file reading when it finds it installed, which costs hundreds of MB and
seconds of start-up in every board; its own reader (the stub it falls back on, and which its `notf` marker
module selects) reads local event files as well, so the marker is set before TensorBoard is imported.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
import types

RELOAD_SECONDS = 1  # how often the board reads the logdir again: a new scalar is served within about this
PARENT_CHECK_SECONDS = 1.0


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        raise SystemExit("usage: board_process LOGDIR SOCKET PATH_PREFIX")
    logdir, socket_path, prefix = argv
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from tensorboard import default, program
    from werkzeug.serving import make_server

    class UnixSocketServer(program.TensorBoardServer):
        """TensorBoard's server interface over werkzeug's threaded server on a UNIX socket."""

        def __init__(self, app, flags):
            self.server = make_server(f"unix://{socket_path}", 0, app, threaded=True)

        def serve_forever(self):
            self.server.serve_forever()

        def get_url(self):
            return f"unix:{socket_path}"

    board = program.TensorBoard(plugins=default.get_plugins(), server_class=UnixSocketServer)
    board.configure(argv=[None, "--logdir", logdir, "--path_prefix", prefix, "--reload_interval",
                          str(RELOAD_SECONDS), "--load_fast", "false"])
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # for sigwait, in every thread
    board.launch()  # serves from a thread of its own
    threading.Thread(target=_end_with_parent, args=(os.path.dirname(socket_path),), daemon=True).start()
    signal.sigwait({signal.SIGTERM, signal.SIGINT})  # the coordinator stops the board
    shutil.rmtree(os.path.dirname(socket_path), ignore_errors=True)  # a coordinator killed with it cannot


def _end_with_parent(folder: str) -> None:
    """A coordinator that ends without stopping its boards (killed, crashed) leaves none behind: the board
    removes its own folder (the socket's) and exits once its parent is gone."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_SECONDS)
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
