"""The manual's state diagrams draw exactly the transitions the state machine allows (tfcluster/states.py):
a change to the table that the architecture page does not show, or an arrow the table does not allow, fails."""

from __future__ import annotations

import re
from pathlib import Path

from tfcluster.states import JOB_TRANSITIONS, PHASE_TRANSITIONS, TASK_TRANSITIONS, TERM_TRANSITIONS

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
ARROW = re.compile(r"^\s*(\w+) --> (\w+)", re.M)


def diagrams() -> list[set[tuple[str, str]]]:
    blocks = re.findall(r"```mermaid\n(stateDiagram-v2.*?)```", ARCHITECTURE.read_text(), re.S)
    return [{(a, b) for a, b in ARROW.findall(block) if "[*]" not in (a, b)} for block in blocks]


def table(transitions) -> set[tuple[str, str]]:
    return {(old.value, new.value) for old, news in transitions.items() for new in news}


def test_the_job_state_diagram_is_the_transition_table():
    assert diagrams()[0] == table(JOB_TRANSITIONS)


def test_the_task_state_diagram_is_the_transition_table():
    assert diagrams()[1] == table(TASK_TRANSITIONS)


def test_the_attempt_and_ha_term_diagrams_are_their_transition_tables():
    assert len(diagrams()) == 4
    assert diagrams()[2] == table(PHASE_TRANSITIONS)
    assert diagrams()[3] == table(TERM_TRANSITIONS)
