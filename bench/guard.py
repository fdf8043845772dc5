"""The regression guard of `make bench`, run last: reads the JSON files the benches wrote in this run (newer than
the file given by --since, which `make bench` touches first) and exits 1 naming each ratio past its target
(bench/targets.py). A target whose file this run did not write is not checked, and says so.

    python bench/guard.py [--since FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterator

from targets import TARGETS, Target

BENCH = Path(__file__).resolve().parent


def values(tree: object, key: str, path: str = "") -> Iterator[tuple[str, object]]:
    """(where, value) of every occurrence of key in a parsed JSON document, at any depth."""
    if isinstance(tree, dict):
        for name, value in tree.items():
            where = f"{path}.{name}" if path else str(name)
            if name == key:
                yield where, value
            else:
                yield from values(value, key, where)
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from values(value, key, f"{path}[{i}]")


def violations(results: dict[str, object], targets: tuple[Target, ...]) -> list[str]:
    """What breaks a target, one line each, given the parsed JSON files of this run by name. A file given without
    its target's ratio breaks it too: the bench stopped writing what it is held to."""
    found = []
    for target in targets:
        if target.file not in results:
            continue
        measured = list(values(results[target.file], target.key))
        if not measured:
            found.append(f"{target.file}: no {target.key} ({target.what}; target <= {target.most}x)")
        for where, ratio in measured:
            if not isinstance(ratio, (int, float)) or ratio > target.most:
                found.append(f"{target.file} {where} = {ratio}, past its target of {target.most}x ({target.what})")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", type=Path, help="check only the JSON files written after this file was")
    args = parser.parse_args()
    since = args.since.stat().st_mtime if args.since else 0.0
    results = {}
    for name in sorted({t.file for t in TARGETS}):
        path = BENCH / name
        if path.exists() and path.stat().st_mtime >= since:
            results[name] = json.loads(path.read_text())
        else:
            print(f"guard: {name} was not written in this run; its targets are not checked")
    broken = violations(results, TARGETS)
    for line in broken:
        print(f"guard: {line}")
    checked = sum(t.file in results for t in TARGETS)
    print(f"guard: {checked} target(s) checked, {len(broken)} broken")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
