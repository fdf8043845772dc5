"""How a bench with one flat table of figures shows them: aligned on the terminal, and as JSON in bench/NAME; and
the filesystem a bench ran on, which its figures name."""

from __future__ import annotations

import json
from pathlib import Path

import psutil


def show_and_save(results: dict, name: str) -> None:
    """Prints each figure on a line, names aligned, and writes them all to bench/<name> (name ends in .json)."""
    width = max((len(key) for key in results), default=0)
    for key, value in results.items():
        print(f"{key:<{width}}  {value}")
    (Path(__file__).resolve().parent / name).write_text(json.dumps(results, indent=2) + "\n")


def filesystem_of(path: Path) -> str:
    """The type of the filesystem path is on (the mount with the longest prefix of it)."""
    resolved = str(path.resolve())
    mounts = [p for p in psutil.disk_partitions(all=True)
              if resolved == p.mountpoint or resolved.startswith(p.mountpoint.rstrip("/") + "/")]
    return max(mounts, key=lambda p: len(p.mountpoint)).fstype if mounts else "unknown"
