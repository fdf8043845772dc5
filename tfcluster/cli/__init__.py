"""The `tfcluster` command: parses, calls the coordinator (or runs a daemon), renders. Thin by design.

Errors are one line on stderr and a non-zero exit (2 for bad input, 1 otherwise), never a traceback.

Quick to start: a run imports the module of the command it runs and nothing else (every command's module for
`tfcluster --help` and for a name that is no command, so that help lists them all and a typo gets suggestions).
"""

from __future__ import annotations

import importlib
import sys

from tfcluster import grpc_settings

grpc_settings.apply()  # before anything imports grpc

# Each command's module under tfcluster.cli, in the order `tfcluster --help` lists them.
COMMAND_MODULES = {
    "dashboard": "cluster", "ca": "cluster", "token": "cluster", "node": "cluster", "doctor": "cluster",
    "up": "bringup", "down": "bringup", "gc": "node", "coordinator": "coordinator", "agent": "agent",
    "start": "jobs", "plan": "jobs", "status": "jobs", "stop": "jobs", "logs": "jobs", "tensorboard": "board",
    "sweep": "sweeps", "usage": "usage", "queue": "queue", "policy": "queue", "demo": "misc", "version": "misc",
}
MODULE_ORDER = ("bringup", "cluster", "node", "coordinator", "agent", "jobs", "board", "sweeps", "usage", "queue", "misc")


def load_commands(argv: list[str]):
    """The app with the commands argv may run: its first word's module, or all of them."""
    wanted = COMMAND_MODULES.get(argv[0]) if argv else None
    for module in (wanted,) if wanted else MODULE_ORDER:
        importlib.import_module(f"tfcluster.cli.{module}")
    from tfcluster.cli.common import app

    if wanted:  # typer builds every command it holds before it runs one: it holds the one that runs
        app.registered_commands[:] = [c for c in app.registered_commands if _name(c) == argv[0]]
        app.registered_groups[:] = [g for g in app.registered_groups if g.name == argv[0]]
    return app


def _name(command) -> str:
    """A command's name as typer gives it: its own, or its function's with dashes."""
    return command.name or command.callback.__name__.lower().replace("_", "-")


def main() -> None:
    app = load_commands(sys.argv[1:])
    import typer

    try:
        sys.exit(app(standalone_mode=False))
    except KeyboardInterrupt:
        sys.exit(130)
    except typer.Abort:
        sys.exit(1)
    except typer.TyperException as e:  # a flag or an argument that does not parse: one line, like every error
        context = getattr(e, "ctx", None)
        if context is not None and e.format_message() == context.get_help():  # no arguments at all
            print(e.format_message())
            sys.exit(e.exit_code)
        from tfcluster.cli.common import err

        where = f"{context.command_path}: " if context is not None else ""
        err.print(f"error: {where}{e.format_message()} (see --help)", markup=False)
        sys.exit(e.exit_code)
