"""The regression guard of `make bench` (bench/guard.py): which ratios break their targets."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # guard.py imports targets.py beside it
spec = importlib.util.spec_from_file_location("bench_guard", BENCH / "guard.py")
guard = importlib.util.module_from_spec(spec)
spec.loader.exec_module(guard)
Target = guard.Target

TARGETS = (Target("hb.json", "vs_plain", 1.3, "plain"), Target("hb.json", "vs_tls", 1.1, "tls"),
           Target("other.json", "vs_floor", 2.0, "other"))


def test_each_ratio_past_its_target_is_named_with_where_it_was_found():
    results = {"hb.json": {"sizes": {"2000": {"vs_plain": 1.3, "vs_tls": 1.05},
                                      "5000": {"vs_plain": 2.9, "vs_tls": 1.2}}}}
    assert guard.violations(results, TARGETS) == [
        "hb.json sizes.5000.vs_plain = 2.9, past its target of 1.3x (plain)",
        "hb.json sizes.5000.vs_tls = 1.2, past its target of 1.1x (tls)"]


def test_a_file_not_written_is_not_checked_but_a_written_file_without_its_ratio_breaks_it():
    results = {"hb.json": {"sizes": {"2000": {"vs_plain": 1.0}}}}
    assert guard.violations(results, TARGETS) == ["hb.json: no vs_tls (tls; target <= 1.1x)"]


def test_a_ratio_that_is_not_a_number_breaks_its_target():
    assert guard.violations({"other.json": [{"vs_floor": None}]}, TARGETS) == [
        "other.json [0].vs_floor = None, past its target of 2.0x (other)"]


def test_the_targets_are_those_docs_state():
    """Every target of make bench is stated in docs/benchmarks.md, at the value the guard holds."""
    docs = (BENCH.parent / "docs" / "benchmarks.md").read_text()
    for target in guard.TARGETS:
        assert f"`{target.key}` ≤ {target.most}x" in docs, target
