"""The TensorBoard folders a coordinator killed with SIGKILL leaves behind (a socket and links, under the temp dir)
are removed by the next coordinator's dashboard; a running coordinator's folders stay."""

from __future__ import annotations

import os
import subprocess

from tfcluster.daemon.coordinator.web.boards import FOLDER_PREFIX, remove_stale_folders


def test_only_folders_of_coordinators_no_longer_running_are_removed(tmp_path):
    ended = subprocess.Popen(["true"])
    ended.wait()
    live = subprocess.Popen(["sleep", "30"])
    try:
        stale = tmp_path / f"{FOLDER_PREFIX}{ended.pid}-abc"
        mine = tmp_path / f"{FOLDER_PREFIX}{os.getpid()}-def"
        other = tmp_path / f"{FOLDER_PREFIX}{live.pid}-ghi"
        unrelated = tmp_path / f"{FOLDER_PREFIX}notapid-jkl"
        for folder in (stale, mine, other, unrelated):
            (folder / "logdir").mkdir(parents=True)
        (stale / "board.sock").write_text("")
        assert remove_stale_folders(str(tmp_path)) == [stale]
        assert not stale.exists() and mine.exists() and other.exists() and unrelated.exists()
    finally:
        live.kill()
        live.wait()
