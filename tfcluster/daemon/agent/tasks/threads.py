"""Threads for the node's attempts, each kept a while for the next one once its attempt ends.

An attempt runs on a thread of its own from its start to its report (supervisor.py): its steps block (the
launcher's answer, the shim's output), and a task may run for days. A node that runs a sweep of tiny tasks
starts thousands a minute, and a new thread for each cost about 0.1 ms of CPU (its stack mapped and given back,
its start waited for) against 0.03 ms for handing the attempt to a thread that waits for one. Unlike a
ThreadPoolExecutor, there is no bound (every attempt runs at once, however many there are) and a thread that
finds nothing to do for IDLE_SECONDS ends, so a node that ran a burst keeps no crowd of threads.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

IDLE_SECONDS = 30.0


class AttemptThreads:
    def __init__(self, idle_seconds: float = IDLE_SECONDS):
        self.idle_seconds = idle_seconds
        self.lock = threading.Lock()
        self.waiting = 0  # threads waiting for a call that no call has been promised to yet
        self.calls: queue.SimpleQueue = queue.SimpleQueue()

    def run(self, call: Callable[[], None], name: str) -> None:
        """call() on a thread of its own at once (named name while it runs): a waiting one, or a new one."""
        with self.lock:
            promised = self.waiting > 0
            if promised:
                self.waiting -= 1  # one waiting thread takes this call: it stays, whatever its timer says
        if promised:
            self.calls.put((call, name))
        else:
            threading.Thread(target=self._serve, args=(call,), name=name, daemon=True).start()

    def _serve(self, call: Callable[[], None] | None) -> None:
        me = threading.current_thread()
        while call is not None:
            try:
                call()
            finally:
                call = None  # the attempt's record and order are not kept while this thread waits
            me.name = "attempt-thread (waiting)"
            with self.lock:
                self.waiting += 1
            try:
                call, me.name = self.calls.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self.lock:
                    if self.waiting > 0:  # more threads wait than calls were promised: this one ends
                        self.waiting -= 1
                        return
                call, me.name = self.calls.get()  # promised to a waiting thread just now: on its way
