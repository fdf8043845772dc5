"""The manual's state diagrams draw exactly the transitions the state machine allows (tfcluster/states.py):
a change to the table that the architecture page does not show, or an arrow the table does not allow, fails."""

from __future__ import annotations

import re
from pathlib import Path

from tfcluster.states import JOB_TRANSITIONS, TASK_TRANSITIONS

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
ARROW = re.compile(r"^\s*(\w+) --> (\w+)", re.M)


def diagrams() -> list[set[tuple[str, str]]]:
    blocks = re.findall(r"```mermaid\n(stateDiagram-v2.*?)```", ARCHITECTURE.read_text(), re.S)
    return [{(a, b) for a, b in ARROW.findall(block) if "[*]" not in (a, b)} for block in blocks]


def table(transitions) -> set[tuple[str, str]]:
    return {(old.value, new.value) for old, news in transitions.items() for new in news}


def test_the_job_state_diagram_is_the_transition_table():
    job, _task = diagrams()
    assert job == table(JOB_TRANSITIONS)


def test_the_task_state_diagram_is_the_transition_table():
    _job, task = diagrams()
    assert task == table(TASK_TRANSITIONS)
