"""Which of the coordinators that share one etcd store leads: the one holding a leader key under a lease.

Every coordinator started on the same etcd prefix campaigns for the key `PREFIX.leader` (beside the documents'
prefix, so loading or watching the state never sees it): one transaction puts the key, bound to a lease of
TTL_SECONDS, only if it does not exist. The winner's writes are fenced on the revision of that put (the store's
Guard): once the lease has run out and the key is gone, or another coordinator holds it, etcd refuses every
transaction this one sends. No consensus of our own: etcd decides who holds the key.

The lease is renewed from a process of its own (ha/lease_keeper.py says why), whose renewals a thread applies. The
leader also counts its lease on its own clock, from the moment it sent the last renewal etcd granted: a process that
was paused (SIGSTOP, a stalled VM) or cut off from etcd knows, before it writes or sends anything, that its lease
may be gone, and stops acting. etcd counts the same lease from when it received that renewal, later, so the leader
always stops first. It then asks etcd once more: a lease etcd still grants was never let go (etcd never revives an
expired lease), so no other coordinator can have held the key meanwhile, and the leader acts again; a lease etcd no
longer knows, or an etcd it cannot reach, and it steps down. A leader whose renewal merely came late, its process
short of CPU while thousands of agents register, thus keeps the leadership instead of handing the same storm to a
standby.

The leader also watches its key (ha/key_watch.py): when anyone deletes it or puts it again, the term ends at once,
not at the leader's next write, which fencing would refuse.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfcluster.daemon.coordinator.ha.key_watch import KeyWatch, Moved
from tfcluster.daemon.coordinator.ha.lease_keeper import RENEW_EVERY_SECONDS, LeaseKeeper, keep_alive
from tfcluster.daemon.coordinator.store.api import Conflict, StoreUnavailable
from tfcluster.daemon.coordinator.store.etcd_gateway import NO_LEADER, NO_QUORUM, UNREACHABLE, EtcdGateway, b64, unb64

log = logging.getLogger("tfcluster.coordinator")

TTL_SECONDS = 2            # how long a leader that stopped renewing still holds the key
# A keeper that reported nothing for this long after the lease ran out on this clock: this process was paused (the
# keeper does not renew while it is), or the keeper is stuck
KEEPER_SILENCE_SECONDS = 3 * TTL_SECONDS
# While etcd regains its quorum, members that restart answer late or not at all: a suspended leader that cannot
# reach etcd for this long after it last heard "no quorum" takes itself for cut off, and steps down
QUORUM_RETURN_SECONDS = 5 * TTL_SECONDS
POLL_SECONDS = 0.2         # how often a standby looks whether the key is free


@dataclass(frozen=True)
class LeaderInfo:
    """Where the leader serves, as its key says (addresses clients and agents can reach)."""
    address: str        # gRPC: agents and clients
    join_address: str   # where nodes join with a token ("" without TLS)

    def to_json(self) -> str:
        return json.dumps({"address": self.address, "join_address": self.join_address})

    @staticmethod
    def from_json(text: str) -> "LeaderInfo":
        try:
            data = json.loads(text)
            return LeaderInfo(str(data.get("address", "")), str(data.get("join_address", "")))
        except (ValueError, AttributeError):
            return LeaderInfo("", "")


class Leadership:
    """One coordinator's candidacy: campaign() until it leads, then the lease, renewed until it is lost."""

    def __init__(self, gateway: EtcdGateway, prefix: str, me: LeaderInfo, ttl: int = TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic, keeper: LeaseKeeper | None = None):
        self.gateway, self.me, self.ttl, self.clock = gateway, me, ttl, clock
        self.keeper = keeper  # the process that sends the renewals; None: this process's own thread
        self.key = prefix.rstrip("/") + ".leader"
        self.leader = LeaderInfo("", "")  # who leads, as last seen (this coordinator, once it won)
        self.lease = 0
        self.revision = 0                 # of the put that made this coordinator the leader
        self.valid_until = 0.0            # on self.clock: the lease may be gone after this
        self.no_quorum = False            # the last renewal failed because etcd had no quorum
        self.suspended = False            # the lease ran out on this clock while etcd had no quorum
        self.no_quorum_at = 0.0           # on self.clock: when a renewal last failed for want of a quorum
        self.on_lost: Callable[[str], None] = lambda why: None
        self._lost = threading.Event()
        self._term_lock = threading.Lock()  # a term's end, against the start of the next one
        self._renewer: threading.Thread | None = None
        self._key_watch: KeyWatch | None = None

    @property
    def lost(self) -> bool:
        """The leadership is over for sure (etcd dropped the lease, or it ran out while etcd had a quorum)."""
        return self._lost.is_set()

    def holds(self) -> bool:
        """Whether this coordinator may still act as the leader: it won, and its lease cannot have run out."""
        return bool(self.lease) and not self._lost.is_set() and self.clock() < self.valid_until

    def campaign(self, stop: threading.Event) -> bool:
        """Blocks until this coordinator leads (True) or stop is set (False). etcd unreachable: tries again."""
        while not stop.is_set():
            try:
                if self._try_to_win():
                    return True
            except StoreUnavailable as e:
                log.warning("cannot campaign for leadership: %s", e)
                # Who leads is no longer known here: naming the last leader seen would send agents (their pulse:
                # tfcluster/daemon/agent/session/pulse.py) away from a coordinator that has won since.
                self.leader = LeaderInfo("", "")
            stop.wait(POLL_SECONDS)
        return False

    def _try_to_win(self) -> bool:
        # The key is read first: a read is no raft proposal, while a lease granted and revoked and a transaction are
        # three, which each standby would otherwise make every POLL_SECONDS for as long as the leader lives.
        kv = (self.gateway.call("/v3/kv/range", {"key": b64(self.key)}).get("kvs") or [None])[0]
        if kv is not None and self._held(kv):
            return False
        sent = self.clock()
        lease = int(self.gateway.call("/v3/lease/grant", {"TTL": self.ttl})["ID"])
        key = b64(self.key)
        answer = self.gateway.call("/v3/kv/txn", {
            "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
            "success": [{"request_put": {"key": key, "value": b64(self.me.to_json()), "lease": str(lease)}}],
            "failure": [{"request_range": {"key": key}}]})
        if not answer.get("succeeded"):
            self._revoke(lease)
            kv = (answer["responses"][0].get("response_range", {}).get("kvs") or [None])[0]
            if kv is not None:
                self._held(kv)
            else:
                self.leader = LeaderInfo("", "")
            return False
        with self._term_lock:
            self.lease, self.revision = lease, int(answer["header"]["revision"])
            self.valid_until, self.leader = sent + self.ttl, self.me
            self.no_quorum = self.suspended = False
            self._lost.clear()
        term = self.revision
        self._key_watch = KeyWatch(self.gateway, self.key, term, lambda moved: self._key_moved(moved, term)).start()
        self._renewer = threading.Thread(target=self._follow_keeper if self.keeper else self._renew,
                                         name="leader-lease", daemon=True)
        self._renewer.start()
        log.info("this coordinator leads (the key %s at revision %d, lease %x of %d s)", self.key, self.revision,
                 lease, self.ttl)
        return True

    def _held(self, kv: dict) -> bool:
        """Whether the key as read is held by a coordinator (it leads, as far as this one knows)."""
        self.leader = LeaderInfo.from_json(unb64(kv.get("value", "")))
        return self.leader != self.me or not self._take_back(int(kv["mod_revision"]))

    def _take_back(self, mod_revision: int) -> bool:
        """The key names this coordinator's own addresses: it was put by an earlier run of this coordinator (killed
        and restarted: the new run could listen where it listened). The key goes at once, if it is still that
        put, rather than when its lease runs out, so a restarted coordinator serves at once. Safe whatever else
        runs: the earlier run's writes are fenced on that put, gone now."""
        key = b64(self.key)
        answer = self.gateway.call("/v3/kv/txn", {
            "compare": [{"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": mod_revision}],
            "success": [{"request_delete_range": {"key": key}}]})
        if answer.get("succeeded"):
            log.info("the leader key named this coordinator's own address (an earlier run of it): taken back")
        return bool(answer.get("succeeded"))

    def _renew(self) -> None:
        """Renews from this thread (no keeper process)."""
        lease, wait = self.lease, RENEW_EVERY_SECONDS
        due = self.clock() + wait
        while not self._lost.wait(wait):
            sent = self.clock()
            try:
                granted, error = keep_alive(self.gateway, lease, sent, self.valid_until, self.ttl), ""
            except (StoreUnavailable, RuntimeError) as e:
                granted, error = 0, str(e)
            _report_late(sent - due, self.clock() - sent)
            wait = 0.0 if self._settle(sent, granted, error) else RENEW_EVERY_SECONDS
            due = self.clock() + wait

    def _follow_keeper(self) -> None:
        """Applies the keeper process's renewals to this term's lease (ha/lease_keeper.py); renews from this thread
        should the keeper be gone. Each turn of this loop tells the keeper that the coordinator still runs."""
        lease, keeper = self.lease, self.keeper
        heard = self.clock()
        try:
            while not self._lost.is_set():
                keeper.renew(lease, self.valid_until, self.ttl)
                report = keeper.next_report(RENEW_EVERY_SECONDS)
                if report is not None and report.lease == lease:
                    if report.sent - heard > 2 * RENEW_EVERY_SECONDS:
                        log.warning("the leader lease's renewals came %.2f s apart: this process or its lease "
                                    "keeper is short of CPU", report.sent - heard)
                    heard = report.sent
                    self._settle(report.sent, report.granted, report.error)
                elif self.clock() - heard > KEEPER_SILENCE_SECONDS and self.clock() >= self.valid_until:
                    self._lose(self._ran_out(self.clock()) + " and its lease keeper process said nothing since "
                               "(was this process paused?)")
            keeper.renew(0)
        except OSError as e:  # the keeper died (killed, out of memory): this thread renews
            log.warning("the lease keeper process is gone (%s): the leader lease is renewed from the coordinator",
                        e)
            self.keeper = None
            self._renew()

    def _settle(self, sent: float, granted: int, error: str) -> bool:
        """Applies the outcome of the renewal sent at sent; True when another is due at once. Once the lease ran
        out on this clock, holds() is False, so nothing is written or sent; but etcd, which counts from a later
        moment, may still hold it: a renewal it grants then means no other coordinator can have held the key."""
        ran_out = sent >= self.valid_until
        if error:
            if NO_QUORUM in error:
                self.no_quorum, self.no_quorum_at = True, sent
            else:  # no answer: while suspended, still the quorum coming back for a while (a safe wait: holds() is
                # False, and etcd extends every lease once it has a leader again)
                self.no_quorum = self.suspended and sent - self.no_quorum_at < QUORUM_RETURN_SECONDS
            log.warning("renewing the leader lease failed: %s", error)
            if ran_out and not self._suspend():
                self._lose(self._ran_out(sent) + " (was this process paused, or cut off from etcd?)")
            return False
        if not granted:
            self._lose((self._ran_out(sent) + " and " if ran_out else "") + "etcd no longer knows its lease")
            return False
        self.valid_until = max(self.valid_until, sent + granted)
        if self.clock() >= self.valid_until:  # granted, but answered too late to count on: again at once
            return True
        if ran_out and not self.suspended:
            log.warning("etcd still held this coordinator's lease, though its renewal came late: it acts again")
        self.no_quorum = False
        if self.suspended:
            self.suspended = False
            log.warning("etcd has a quorum again and this coordinator still holds its lease: it acts again")
        return False

    def _ran_out(self, sent: float) -> str:
        return f"its lease ran out {sent - self.valid_until + self.ttl:.1f} s after the last renewal etcd granted"

    def _suspend(self) -> bool:
        """Whether the lease that ran out on this coordinator's clock may still be its own: etcd answers, without a
        quorum, so no other coordinator can take the key either. It then neither writes nor sends (holds() is
        False) but keeps serving, and acts again once a renewal is granted (etcd extends its leases when it
        has a leader again)."""
        if self.no_quorum and not self.suspended:
            self.suspended = True
            log.warning("etcd has no quorum: this coordinator changes nothing until it has one again")
        return self.no_quorum

    def _key_moved(self, moved: Moved, term: int) -> None:
        """The key changed after the put that began the term (ha/key_watch.py). Whoever did it, the term is over."""
        if not moved.deleted:
            holder = LeaderInfo.from_json(moved.value).address or "no coordinator"
            lease = f"lease {moved.lease:x}" if moved.lease else "no lease"
            why = f"the key {self.key} was put again at revision {moved.revision}, naming {holder} ({lease})"
        elif self.holds():  # this clock counts a lease out before etcd does: etcd cannot have let it go
            why = (f"the key {self.key} was deleted at revision {moved.revision} while its lease held: a client "
                   f"of etcd deleted it")
        else:
            why = (f"the key {self.key} was deleted at revision {moved.revision}, after its lease ran out on this "
                   f"coordinator's clock")
        self._lose(why, term)

    def _lose(self, why: str, term: int = 0) -> None:
        """Ends the term (term: the revision of the put that began it; 0: the term now)."""
        with self._term_lock:
            if self._lost.is_set() or (term and term != self.revision):
                return  # over already, or a watch of an earlier term saw the next one begin
            self._lost.set()
        log.critical("this coordinator no longer leads: %s; it writes and sends nothing more", why)
        self.on_lost(why)

    def step_down(self) -> None:
        """Stops renewing (the lease is given back by resign() or runs out); campaign() may be called again."""
        self._lost.set()
        if self._key_watch is not None:
            self._key_watch.stop()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join(timeout=RENEW_EVERY_SECONDS * 3)
        self._renewer, self._key_watch = None, None
        self.lease, self.revision, self.valid_until = 0, 0, 0.0
        self.leader = LeaderInfo("", "")  # who leads now is for the key to say (campaign() reads it)

    def resign(self) -> None:
        """Gives the key up at once (a clean stop): a standby takes over without waiting for the lease to end."""
        lease = self.lease
        self.step_down()
        if lease:
            self._revoke(lease)
            log.info("gave up the leadership (lease %x revoked)", lease)

    def _revoke(self, lease: int) -> None:
        try:
            self.gateway.call("/v3/lease/revoke", {"ID": str(lease)})
        except (StoreUnavailable, RuntimeError) as e:  # it runs out on its own
            log.debug("revoking lease %x: %s", lease, e)


def _report_late(late: float, took: float) -> None:
    """A renewal that woke late or waited long for its answer says so: the first sign that this process (or
    etcd) is short of CPU, before a lease is lost to it."""
    if late + took > RENEW_EVERY_SECONDS:
        log.warning("renewing the leader lease: it woke %.2f s late, and its answer took %.2f s", late, took)


class LeaderStore:
    """The leader's store: each write goes through only while the lease holds (the etcd store's guard refuses it
    in etcd too). A refusal is the store's Conflict: the coordinator stops acting at once (persistence.py)."""

    def __init__(self, store: Any, leadership: Leadership, documents: Callable[[], list] | None = None):
        self.store, self.leadership = store, leadership
        self.location = store.location
        self._documents = documents  # a standby's warm copy, when it is current; None: load from etcd

    def load(self) -> list:
        warm = self._documents() if self._documents is not None else None
        return warm if warm is not None else self.store.load()

    def write(self, writes):
        leadership = self.leadership
        if leadership.lost:
            raise Conflict(f"the key {leadership.key} is no longer this coordinator's: this writer no longer holds it")
        if not leadership.holds():  # its lease ran out on this clock: not a write until a renewal says more
            health = NO_LEADER if leadership.suspended else leadership.gateway.health()
            if health == NO_LEADER:
                raise StoreUnavailable(f"{NO_QUORUM}: this coordinator changes nothing until etcd has a quorum "
                                       f"again")
            if health == UNREACHABLE:
                raise StoreUnavailable(f"cannot reach etcd at {leadership.gateway.describe()}: this coordinator "
                                       f"changes nothing until it reaches etcd again, or it stands down")
            raise StoreUnavailable("etcd did not renew this coordinator's leader lease in time: it changes nothing "
                                   "until it is renewed or it stands down")
        return self.store.write(writes)

    def close(self) -> None:
        self.store.close()
