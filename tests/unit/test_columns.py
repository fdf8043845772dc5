"""The client's plain tables: aligned columns a person reads and grep and awk split, colour only on request."""

from __future__ import annotations

import io

from tfcluster.columns import Painted, colour_wanted, table


def test_columns_line_up_under_upper_case_headers_and_no_line_ends_in_blanks():
    text = table(("node", "state", "message"), [["a", "READY", ""], ["node-b", Painted("LOST", "red"), "gone"]],
                 title="nodes")
    assert text.splitlines() == ["nodes",
                                 "NODE    STATE  MESSAGE",
                                 "a       READY",
                                 "node-b  LOST   gone"]
    assert [line.split() for line in text.splitlines()[2:]] == [["a", "READY"], ["node-b", "LOST", "gone"]]


def test_a_cell_with_line_breaks_stays_on_its_row():
    assert table(("task", "message"), [["worker:0", "exited\nwith code 1"]]).splitlines()[1] == \
        "worker:0  exited with code 1"


def test_colour_is_escapes_that_do_not_move_the_columns():
    rows = [[Painted("FAILED", "red"), "x"], ["RUNNING", "y"]]
    coloured = table(("state", "job"), rows, colour_on=True).splitlines()
    assert coloured[1] == "\x1b[31mFAILED\x1b[0m   x"
    assert coloured[2] == "RUNNING  y"
    assert "\x1b" not in table(("state", "job"), rows)


def test_colour_is_wanted_on_a_terminal_only_and_never_with_no_color(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert colour_wanted(Terminal()) and not colour_wanted(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colour_wanted(Terminal())
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not colour_wanted(Terminal())
