"""How a bench with one flat table of figures shows them: aligned on the terminal, and as JSON in bench/NAME."""

from __future__ import annotations

import json
from pathlib import Path


def show_and_save(results: dict, name: str) -> None:
    """Prints each figure on a line, names aligned, and writes them all to bench/<name> (name ends in .json)."""
    width = max((len(key) for key in results), default=0)
    for key, value in results.items():
        print(f"{key:<{width}}  {value}")
    (Path(__file__).resolve().parent / name).write_text(json.dumps(results, indent=2) + "\n")
