"""Finding the directory that keeps a user from a path, as the kernel walks it: component by component, through
symbolic links, relative and absolute, and `..` after a link."""

from __future__ import annotations

import grp
import os
import pwd

from tfcluster import reach


def tree(tmp_path):
    """open/ -> locked/python (a link, as a virtualenv's python), locked/ closed to others (0700)."""
    locked = tmp_path / "locked"
    (locked / "bin").mkdir(parents=True)
    (locked / "bin" / "python3").write_text("")
    locked.chmod(0o700)
    opened = tmp_path / "open"
    opened.mkdir()
    (opened / "python").symlink_to(locked / "bin" / "python3")
    (opened / "relative").symlink_to("../locked/bin/python3")
    (opened / "up").symlink_to("../locked/bin")
    tmp_path.chmod(0o755)
    return locked, opened


def test_the_closed_directory_is_found_through_absolute_and_relative_links(tmp_path):
    locked, opened = tree(tmp_path)
    closed = {str(locked)}
    refuse = lambda d: d not in closed  # noqa: E731  (as a user who may pass everything but `locked`)
    assert reach.first_blocked(str(opened / "python"), refuse) == str(locked)
    assert reach.first_blocked(str(opened / "relative"), refuse) == str(locked)
    assert reach.first_blocked(str(opened / "up" / ".." / "bin" / "python3"), refuse) == str(locked)
    assert reach.first_blocked(str(opened / "python"), lambda d: True) is None
    assert reach.first_blocked("relative", refuse, cwd=str(opened)) == str(locked)


def test_a_missing_path_is_no_question_of_reach(tmp_path):
    assert reach.first_blocked(str(tmp_path / "nothing" / "here"), lambda d: True) is None


def test_a_loop_of_links_ends(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    assert reach.first_blocked(str(tmp_path / "a" / "x"), lambda d: True) is None


def test_every_directory_closed_to_others_on_the_way_is_listed_outermost_first(tmp_path):
    locked, opened = tree(tmp_path)
    (locked / "bin").chmod(0o750)
    assert reach.closed_dirs(str(opened / "python")) == [str(locked), str(locked / "bin")]
    assert reach.closed_dirs(str(opened)) == []


def test_a_directory_is_described_with_its_mode_and_owner(tmp_path):
    locked, _ = tree(tmp_path)
    owner = f"{pwd.getpwuid(os.getuid()).pw_name}:{grp.getgrgid(os.getgid()).gr_name}"
    assert reach.describe(str(locked)) == f"{locked} (mode 0700, owner {owner})"
    assert reach.describe(str(tmp_path / "gone")) == str(tmp_path / "gone")
