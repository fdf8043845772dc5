"""The CLI reference (docs/cli.md) has a section for every command, naming each of its flags: a flag added
without a word in the manual fails here. Flags every client command shares are described once, above the
first command's section."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

import tfcluster.cli

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


# typer builds on a click of its own (vendored in recent releases): commands and options are told apart by what
# they have, not by click's classes.
def commands(group, prefix: str = "tfcluster") -> dict:
    """Every runnable command by its full name, e.g. 'tfcluster ca issue'; a group that runs by itself too
    ('tfcluster coordinator', besides 'tfcluster coordinator migrate-store') counts as a command."""
    found = {}
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            found.update(commands(command, f"{prefix} {name}"))
            if getattr(command, "invoke_without_command", False):
                found[f"{prefix} {name}"] = command
        else:
            found[f"{prefix} {name}"] = command
    return found


def flags(command) -> set[str]:
    names = set()
    for param in command.params:
        if param.param_type_name == "option":
            names.update(n for n in (*param.opts, *param.secondary_opts) if n.startswith("--"))
    return names - {"--help"}


def sections(markdown: str) -> tuple[str, dict[str, str]]:
    """The prose above the first '## ' heading (less the synopsis of every command, which alone would not
    describe a flag), and each '## tfcluster ...' section by its heading."""
    parts = re.split(r"^## (tfcluster[^\n]*)\n", markdown, flags=re.M)
    return re.sub(r"^```.*?^```", "", parts[0], flags=re.M | re.S), dict(zip(parts[1::2], parts[2::2]))


def section_of(name: str, by_heading: dict[str, str]) -> str | None:
    """The section of a command: its own heading, else its group's ('tfcluster ca' for 'tfcluster ca init')."""
    matches = [h for h in by_heading if name == h or name.startswith(h + " ")]
    return by_heading[max(matches, key=len)] if matches else None


def test_every_command_and_flag_is_in_the_cli_reference():
    intro, by_heading = sections(REFERENCE.read_text())
    missing = []
    for name, command in sorted(commands(typer.main.get_command(tfcluster.cli.load_commands([]))).items()):
        section = section_of(name, by_heading)
        if section is None:
            missing.append(f"{name}: no section")
            continue
        missing += [f"{name} {flag}" for flag in sorted(flags(command))
                    if not re.search(re.escape(flag) + r"(?![\w-])", section + intro)]
    assert not missing, "docs/cli.md does not describe:\n" + "\n".join(missing)


def test_sections_are_found_by_command_and_the_synopsis_does_not_count():
    intro, by_heading = sections("```\ntfcluster stop --now\n```\nintro --tls-dir\n"
                                 "## tfcluster status\n--json\n## tfcluster ca\n--dir\n")
    assert section_of("tfcluster status", by_heading) == "--json\n"
    assert section_of("tfcluster ca issue", by_heading) == "--dir\n"
    assert section_of("tfcluster stop", by_heading) is None
    assert "--tls-dir" in intro and "--now" not in intro
