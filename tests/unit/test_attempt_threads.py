"""The agent's attempt threads (tasks/threads.py): every attempt runs at once on a thread of its own, a thread
that ended one takes the next, and threads left with nothing to do end."""

from __future__ import annotations

import queue
import threading
import time

from harness import wait_until
from tfcluster.daemon.agent.tasks.threads import AttemptThreads


def ran_on(threads: AttemptThreads, name: str) -> threading.Thread:
    """The thread the call ran on, once it ran."""
    done, seen = threading.Event(), []

    def call() -> None:
        seen.append((threading.current_thread(), threading.current_thread().name))
        done.set()
    threads.run(call, name)
    assert done.wait(10)
    assert seen[0][1] == name  # named for the attempt while it runs
    return seen[0][0]


def test_an_attempt_after_another_ended_runs_on_the_same_thread():
    threads = AttemptThreads()
    first = ran_on(threads, "task-a")
    wait_until(lambda: threads.waiting == 1, 5, what="the thread to wait for the next attempt")
    assert ran_on(threads, "task-b") is first
    wait_until(lambda: threads.waiting == 1, 5, what="the thread to wait again")
    assert first.name == "attempt-thread (waiting)"


def test_every_attempt_runs_at_once_however_many_run_already():
    threads = AttemptThreads()
    release, started = threading.Event(), []
    lock = threading.Lock()

    def call() -> None:
        with lock:
            started.append(threading.current_thread())
        release.wait(10)
    for i in range(50):  # more than any pool's usual bound: each blocks until released
        threads.run(call, f"task-{i}")
    try:
        wait_until(lambda: len(started) == 50, 10, what="all 50 attempts to start while the others block")
        assert len(set(started)) == 50
    finally:
        release.set()
    wait_until(lambda: threads.waiting == 50, 10, what="the 50 threads to wait for more")


def test_threads_with_nothing_to_do_end_and_a_later_attempt_gets_a_new_one():
    threads = AttemptThreads(idle_seconds=0.2)
    first = ran_on(threads, "task-a")
    first.join(5)
    assert not first.is_alive() and threads.waiting == 0
    assert ran_on(threads, "task-b") is not first


def test_an_attempt_that_raises_ends_its_thread_and_the_next_runs_all_the_same():
    threads = AttemptThreads()

    def broken() -> None:
        raise RuntimeError("a bug in one attempt's thread")
    previous_hook = threading.excepthook
    threading.excepthook = lambda args: None  # the bug is expected here: not printed
    try:
        threads.run(broken, "task-broken")
        time.sleep(0.2)
    finally:
        threading.excepthook = previous_hook
    assert threads.waiting == 0  # it ended; it never counted as waiting
    ran_on(threads, "task-next")
    wait_until(lambda: threads.waiting == 1, 5, what="the new thread to wait")


def test_waiting_threads_pick_up_a_burst_without_leaving_any_attempt_behind():
    threads = AttemptThreads(idle_seconds=0.05)  # threads time out while attempts are handed to them
    done = []
    lock = threading.Lock()

    def call() -> None:
        with lock:
            done.append(1)
    for round_ in range(20):
        for _ in range(20):
            threads.run(call, "task")
        time.sleep(0.03 if round_ % 2 else 0.06)  # about when waiting threads give up
    wait_until(lambda: len(done) == 400, 10, what="every attempt of the bursts to run")


def test_an_attempt_promised_to_a_thread_as_its_wait_ran_out_is_run_by_it():
    threads = AttemptThreads()
    late = threading.Event()

    class TimesOutJustAsACallComes(queue.SimpleQueue):
        """The first wait with a timeout ends as if it ran out, after an attempt was handed to the waiting thread."""
        timed_out = False

        def get(self, block=True, timeout=None):
            if timeout is not None and not self.timed_out:
                self.timed_out = True
                threads.run(late.set, "task-late")  # promised to the one waiting thread, put in the queue
                raise queue.Empty
            return super().get(block, timeout)
    threads.calls = TimesOutJustAsACallComes()
    first = ran_on(threads, "task-first")
    assert late.wait(5), "the attempt promised to the waiting thread never ran"
    wait_until(lambda: threads.waiting == 1, 5, what="the same thread to wait again")
    assert first.is_alive()
