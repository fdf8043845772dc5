"""The shim starts its task with posix_spawn (shim/spawn.py), as subprocess.Popen started it before: the program
found along the task's own PATH, the first real exec error reported with the program's name, the task's working
directory (the shim's own kept), a session of its own, /dev/null as stdin, stdout and stderr on one pipe,
SIGPIPE at its default, and no descriptor of the shim's past 2."""

from __future__ import annotations

import errno
import os
import signal
import stat

import pytest

from tfcluster.daemon.agent.shim import spawn


def run(command, workdir="", env=None):
    task = spawn.start(command, workdir, env if env is not None else {"PATH": os.environ["PATH"]})
    output = task.stdout.read()
    task.stdout.close()
    return task.wait(), output.decode()


def test_the_task_gets_its_own_session_dev_null_in_one_pipe_out_and_nothing_else_of_the_shims(tmp_path):
    leaked = os.open(tmp_path, os.O_RDONLY)  # the shim's own, even one made inheritable: not the task's
    os.set_inheritable(leaked, True)
    try:
        code, out = run(["sh", "-c", "echo out; echo err >&2; ps -o sid= -p $$; cat; ls /proc/$$/fd; "
                                     "grep SigIgn /proc/$$/status; exit 7"])
    finally:
        os.close(leaked)
    lines = out.split("\n")
    assert code == 7 and lines[:2] == ["out", "err"]
    assert lines[2].strip() != str(os.getsid(0)), "a session of its own"
    assert sorted(lines[3:6]) == ["0", "1", "2"] and lines[6].startswith("SigIgn"), out
    ignored = int(lines[6].split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), "SIGPIPE at its default, as Popen left it"


def test_the_program_is_looked_for_along_the_tasks_path_and_the_first_real_error_is_reported(tmp_path):
    first, second, third = (tmp_path / name for name in ("first", "second", "third"))
    for d in (first, second, third):
        d.mkdir()
    (second / "prog").write_text("#!/bin/sh\necho from second\n")  # not executable: EACCES, remembered
    found = third / "prog"
    found.write_text("#!/bin/sh\necho from third\n")
    found.chmod(0o755)
    path = f"{first}:{second}:{third}"
    assert run(["prog"], env={"PATH": path}) == (0, "from third\n")
    found.unlink()
    with pytest.raises(PermissionError) as refused:
        run(["prog"], env={"PATH": path})
    assert refused.value.errno == errno.EACCES and refused.value.filename == "prog"
    with pytest.raises(FileNotFoundError) as missing:
        run(["no-such-program"], env={"PATH": path})
    assert missing.value.filename == "no-such-program"


def test_a_path_with_a_slash_is_run_as_it_is_in_the_tasks_working_directory(tmp_path):
    script = tmp_path / "work" / "run.sh"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\npwd\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    before = os.getcwd()
    with spawn.keeping_cwd():
        code, out = run(["./run.sh"], workdir=str(script.parent), env={})
    assert (code, out) == (0, f"{script.parent}\n")
    assert os.getcwd() == before, "the shim is back in its own dir"
    with pytest.raises(FileNotFoundError) as gone, spawn.keeping_cwd():
        run(["true"], workdir=str(tmp_path / "gone"))
    assert gone.value.filename == str(tmp_path / "gone") and os.getcwd() == before


def test_a_task_killed_by_a_signal_gives_its_negative_number_and_bad_input_a_value_error():
    task = spawn.start(["sleep", "60"], "", {"PATH": os.environ["PATH"]})
    os.kill(task.pid, signal.SIGKILL)
    assert task.wait() == -signal.SIGKILL and task.returncode == -signal.SIGKILL
    task.stdout.close()
    with pytest.raises(ValueError):
        spawn.start(["true"], "", {"PATH": os.environ["PATH"], "A=B": "x"})


def test_a_shim_whose_own_dir_was_removed_still_starts_its_task_and_goes_back_to_it(tmp_path):
    before = os.getcwd()
    gone = tmp_path / "gone"
    gone.mkdir()
    os.chdir(gone)
    try:
        own = os.stat(".")
        gone.rmdir()
        with spawn.keeping_cwd():
            assert run(["pwd"], workdir=str(tmp_path)) == (0, f"{tmp_path}\n")
        assert os.path.samestat(os.stat("."), own)
    finally:
        os.chdir(before)
