"""The leader's watch on its own key: a term ends the moment the key is deleted or put again, by anyone.

Fencing (etcdstore.py's guard) refuses every write of a leader whose key moved, but only at its next write: a
leader with nothing to write (a steady cluster writes nothing) would go on answering as the leader, and holding
its agents' streams, while another coordinator leads or none does. Anyone who reaches etcd can delete the key or
put another value under another lease; etcd deletes it too when the lease runs out there first. So from the
moment it wins, the leader watches the key from the revision after its own put: any event on it, whatever it is,
means the key is no longer the one this term holds.

The watch is one streaming POST to the JSON gateway (`/v3/watch`, store/etcd_gateway.py), which carries nothing while
the key stays put, so a member that stopped answering looks like a quiet key. A watch that carried nothing for
IDLE_SECONDS, or that ended (its member went, or etcd cancelled it after compacting the revisions it was to
start from), is followed by one read of the key through any member that answers: a key not at this term's
revision ends the term; otherwise a new watch starts after the revision that read saw, so no change falls
between two watches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3

from tfcluster.daemon.coordinator.store.api import StoreUnavailable
from tfcluster.daemon.coordinator.store.etcd_gateway import EtcdGateway, b64, unb64

log = logging.getLogger("tfcluster.coordinator")

# How long a quiet watch is trusted before the key is read: a deletion while the watch's member does not answer
# shows within this and the read's own time. A read is no raft proposal; etcd writes nothing for it.
IDLE_SECONDS = 2.0
RETRY_SECONDS = 0.2  # after a watch that failed, or a read etcd did not answer


@dataclass(frozen=True)
class Moved:
    """What became of the key, seen at revision: deleted, or put again with value under lease (0: none)."""
    revision: int
    deleted: bool
    value: str = ""
    lease: int = 0


class KeyWatch:
    """Follows the key put at revision on a thread of its own; calls moved once, from that thread, when the key
    changes after it. stop() makes it call nothing more (its thread ends within IDLE_SECONDS)."""

    def __init__(self, gateway: EtcdGateway, key: str, revision: int, moved: Callable[[Moved], None]):
        self.gateway, self.key, self.revision, self.moved = gateway, key, revision, moved
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._follow, name="leader-key-watch", daemon=True)

    def start(self) -> "KeyWatch":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _follow(self) -> None:
        after = self.revision  # the key is known to be this term's up to this revision
        while not self.stopped.is_set():
            try:
                request = {"key": b64(self.key), "start_revision": after + 1}
                for result in self.gateway.watch(request, idle=IDLE_SECONDS):
                    events = result.get("events") or []
                    if events:
                        self._report(_moved(events[0]))
                        return
                    if result.get("canceled"):
                        break
            except urllib3.exceptions.ReadTimeoutError:
                pass  # quiet for IDLE_SECONDS
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
                log.debug("the watch on %s failed (%s): reading it", self.key, e)
                self.stopped.wait(RETRY_SECONDS)  # a member that refuses at once is not asked in a busy loop
            if self.stopped.is_set():
                return
            after = self._read(after)

    def _read(self, after: int) -> int:
        """Reads the key once: reports it moved, else gives the revision the read saw (after, when etcd does not
        answer: the lease's renewals say what that means for the term)."""
        try:
            answer = self.gateway.call("/v3/kv/range", {"key": b64(self.key)})
        except (StoreUnavailable, RuntimeError) as e:
            log.debug("reading %s: %s", self.key, e)
            self.stopped.wait(RETRY_SECONDS)
            return after
        seen = int(answer["header"]["revision"])
        kv = (answer.get("kvs") or [None])[0]
        if kv is None:
            self._report(Moved(seen, deleted=True))
        elif int(kv["mod_revision"]) != self.revision:
            self._report(_put(kv))
        return seen

    def _report(self, moved: Moved) -> None:
        if not self.stopped.is_set():
            self.stopped.set()
            self.moved(moved)


def _moved(event: dict[str, Any]) -> Moved:
    kv = event["kv"]
    return Moved(int(kv["mod_revision"]), deleted=True) if event.get("type") == "DELETE" else _put(kv)


def _put(kv: dict[str, Any]) -> Moved:
    return Moved(int(kv["mod_revision"]), deleted=False, value=unb64(kv.get("value", "")),
                 lease=int(kv.get("lease", 0)))
