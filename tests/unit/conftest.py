"""Checks every test of the coordinator's core makes (those that drive a coresim.Sim) at its end."""

from __future__ import annotations

import pytest

from coresim import Sim, check_held


@pytest.fixture(autouse=True)
def held_matches_the_jobs():
    """Whatever a test did to its cluster, what the nodes hold, kept as jobs change, equals it added up from the
    jobs (the scheduler places against it: a stale entry would place two tasks on one port or GPU)."""
    Sim.current = None
    yield
    sim, Sim.current = Sim.current, None
    if sim is not None:
        check_held(sim.c)
