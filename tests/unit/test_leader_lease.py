"""The leader lease against a scripted etcd: how long a renewal may wait, what a late renewal costs, what a
standby asks etcd while a leader holds the key, and how the leader's watch on its key ends its term. (With a
real etcd: tests/integration/test_failover.py, test_leader_key.py.)"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time

import urllib3

from tfcluster.daemon.coordinator.ha import key_watch as keywatch
from tfcluster.daemon.coordinator.ha.key_watch import Moved
from tfcluster.daemon.coordinator.ha.leadership import RENEW_EVERY_SECONDS, LeaderInfo, Leadership
from tfcluster.daemon.coordinator.ha.lease_keeper import ACK_TTLS, Renewing, parent_stopped
from tfcluster.daemon.coordinator.store.api import StoreUnavailable
from tfcluster.daemon.coordinator.store.etcd_gateway import NO_QUORUM, b64, unb64

ME = LeaderInfo("10.0.0.1:7070", "10.0.0.1:7071")
OTHER = LeaderInfo("10.0.0.2:7070", "10.0.0.2:7071")


class ScriptedEtcd:
    """Answers the calls Leadership makes, as etcd would with the key free (or held by `holder`), and records them.
    grants: what each keepalive answers (the TTL; 0: the lease is unknown), the last one repeated. A watch
    streams what a test puts in `watched` (the latest watch's queue), and ends as a quiet one does after its idle
    seconds."""

    def __init__(self, holder: LeaderInfo | None = None, grants: list[int] | None = None):
        self.holder, self.grants = holder, list(grants or [2])
        self.key_revision, self.revision = 5, 20  # the key's mod_revision; etcd's revision
        self.calls: list[tuple[str, float | None]] = []  # (path, the seconds it was given)
        self.on_keepalive = lambda: None
        self.kept_alive = threading.Event()
        self.watches: list[int] = []  # the start_revision of each watch
        self.streams: list[queue.Queue] = []  # what each watch streams

    def call(self, path: str, body: dict, within: float | None = None) -> dict:
        self.calls.append((path, within))
        if path == "/v3/kv/range":
            return {"kvs": [self._kv()] if self.holder else [], "header": {"revision": str(self.revision)}}
        if path == "/v3/lease/grant":
            return {"ID": "7"}
        if path == "/v3/kv/txn":
            if self.holder:
                return {"succeeded": False, "responses": [{"response_range": {"kvs": [self._kv()]}}]}
            self.revision += 1
            self.key_revision = self.revision
            self.holder = LeaderInfo.from_json(unb64(body["success"][0]["request_put"]["value"]))
            return {"succeeded": True, "header": {"revision": str(self.revision)}}
        if path == "/v3/lease/keepalive":
            self.on_keepalive()
            ttl = self.grants.pop(0) if len(self.grants) > 1 else self.grants[0]
            self.kept_alive.set()
            return {"result": {"TTL": str(ttl)}}
        return {}

    @property
    def watched(self) -> queue.Queue:
        return self.streams[-1]

    def watch(self, request: dict, idle: float | None = None):
        stream: queue.Queue = queue.Queue()
        self.streams.append(stream)
        self.watches.append(int(request["start_revision"]))
        while True:
            try:
                yield stream.get(timeout=idle)
            except queue.Empty:
                raise urllib3.exceptions.ReadTimeoutError(None, "/v3/watch", "read timed out") from None

    def _kv(self) -> dict:
        return {"key": b64("/t.leader"), "value": b64(self.holder.to_json()), "mod_revision": str(self.key_revision)}

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]


class Clock:
    """time.monotonic, plus a skew a test adds: the process 'was not scheduled' for that long."""

    def __init__(self):
        self.skew = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skew


def leading(etcd: ScriptedEtcd, clock: Clock = None) -> Leadership:
    leadership = Leadership(etcd, "/t", ME, ttl=2, clock=clock or time.monotonic)
    assert leadership.campaign(threading.Event())
    return leadership


def wait_for(predicate, seconds: float = 3.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.01)


def test_a_renewal_is_given_no_longer_than_what_is_left_of_the_lease():
    etcd = ScriptedEtcd()
    leadership = leading(etcd)
    try:
        wait_for(lambda: etcd.paths().count("/v3/lease/keepalive") >= 2)
        given = [within for path, within in etcd.calls if path == "/v3/lease/keepalive"]
        # An answer after the lease ran out keeps nothing: each renewal may take what was left when it was sent.
        assert all(within is not None and 0 < within <= 2 - RENEW_EVERY_SECONDS + 0.1 for within in given), given
    finally:
        leadership.step_down()


def test_a_renewal_that_came_late_but_that_etcd_still_grants_keeps_the_leadership_without_acting_meanwhile():
    clock, etcd = Clock(), ScriptedEtcd()
    leadership = leading(etcd, clock)
    lost, acting_while_asking = [], []
    leadership.on_lost = lost.append
    try:
        wait_for(etcd.kept_alive.is_set)
        etcd.on_keepalive = lambda: acting_while_asking.append(leadership.holds())
        clock.skew = 5.0  # the renewer did not run for 5 s: the lease ran out on this clock
        acting_while_asking.clear()
        wait_for(lambda: len(acting_while_asking) >= 2)
        assert acting_while_asking[0] is False, "while etcd is asked, the leader writes and sends nothing"
        assert not lost and not leadership.lost, lost
        wait_for(leadership.holds)  # etcd granted the lease again: it acts again
    finally:
        leadership.step_down()


def test_a_renewal_that_came_late_and_that_etcd_no_longer_knows_steps_down():
    clock, etcd = Clock(), ScriptedEtcd(grants=[2, 0])
    leadership = leading(etcd, clock)
    lost = []
    leadership.on_lost = lost.append
    try:
        wait_for(etcd.kept_alive.is_set)
        clock.skew = 5.0
        wait_for(lambda: leadership.lost and lost)
        assert not leadership.holds()
        assert "its lease ran out" in lost[0] and "etcd no longer knows its lease" in lost[0], lost
    finally:
        leadership.step_down()


def failing_renewals(etcd: ScriptedEtcd, errors: list[str], clock: Clock | None = None, step: float = 0.0):
    """From now on each renewal fails with the next of errors, advancing clock by step; once they are spent,
    etcd grants the lease again."""
    def keepalive():
        if clock is not None:
            clock.skew += step
        if errors:
            raise StoreUnavailable(errors.pop(0))
    etcd.on_keepalive = keepalive


UNREACHABLE_ETCD = "cannot reach etcd at 127.0.0.1:2379: no answer, not even to a status request"


def losing_quorum(errors: list[str], step: float = 0.0) -> tuple[ScriptedEtcd, Leadership, list[str]]:
    """A leader whose renewals fail with errors from now on (see failing_renewals), its lease run out on its
    clock; and the reasons it gave for losing the leadership."""
    clock, etcd = Clock(), ScriptedEtcd()
    leadership = leading(etcd, clock)
    lost: list[str] = []
    leadership.on_lost = lost.append
    wait_for(etcd.kept_alive.is_set)
    failing_renewals(etcd, errors, clock, step)
    clock.skew += 5.0
    return etcd, leadership, lost


def test_a_leader_suspended_for_want_of_quorum_waits_out_members_that_do_not_answer_while_it_comes_back():
    errors = [f"{NO_QUORUM} (etcd 127.0.0.1:2379)", UNREACHABLE_ETCD, UNREACHABLE_ETCD]
    etcd, leadership, lost = losing_quorum(errors)
    try:
        wait_for(lambda: not errors, 5)  # then etcd, with a leader again, still holds the lease
        wait_for(leadership.holds, 5)
        assert not lost and not leadership.suspended, lost
    finally:
        leadership.step_down()


def test_a_suspended_leader_that_cannot_reach_etcd_for_long_steps_down():
    etcd, leadership, lost = losing_quorum([f"{NO_QUORUM} (etcd 127.0.0.1:2379)"] + [UNREACHABLE_ETCD] * 20,
                                           step=3.0)
    try:
        wait_for(lambda: leadership.lost and lost, 5)
        unanswered = etcd.paths().count("/v3/lease/keepalive")
        assert unanswered >= 5, "members restarting are waited out for a while"  # 3 s apart, 10 s of grace
        assert "cut off from etcd" in lost[0], lost
    finally:
        leadership.step_down()


def test_a_standby_only_reads_the_key_while_another_coordinator_holds_it():
    etcd = ScriptedEtcd(holder=OTHER)
    leadership = Leadership(etcd, "/t", ME, ttl=2)
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    assert not leadership.campaign(stop)
    assert leadership.leader == OTHER
    # No lease granted and revoked, no transaction: nothing that etcd must write, however long the leader lives.
    assert set(etcd.paths()) == {"/v3/kv/range"} and len(etcd.paths()) >= 2, etcd.paths()


def test_a_standby_that_cannot_read_the_key_names_no_leader_until_it_can_again():
    etcd = ScriptedEtcd(holder=OTHER)
    leadership = Leadership(etcd, "/t", ME, ttl=2)
    reachable = threading.Event()
    reachable.set()
    answer = etcd.call

    def call(path: str, body: dict, within: float | None = None) -> dict:
        if not reachable.is_set():
            raise StoreUnavailable("etcd: connection refused")
        return answer(path, body, within)
    etcd.call = call
    stop = threading.Event()
    campaign = threading.Thread(target=leadership.campaign, args=(stop,))
    campaign.start()
    try:
        wait_for(lambda: leadership.leader == OTHER)
        reachable.clear()  # cut off from etcd: OTHER may have lost the key to a third coordinator meanwhile
        wait_for(lambda: leadership.leader == LeaderInfo("", ""))
        reachable.set()
        wait_for(lambda: leadership.leader == OTHER)
    finally:
        stop.set()
        campaign.join(5)


def test_a_standby_takes_back_the_key_an_earlier_run_of_itself_left_and_leads():
    etcd = ScriptedEtcd(holder=ME)

    def taken_back(path: str, body: dict, within: float | None = None) -> dict:
        if path == "/v3/kv/txn" and "request_delete_range" in str(body):
            etcd.holder = None
            return {"succeeded": True}
        return ScriptedEtcd.call(etcd, path, body, within)

    etcd.call = taken_back
    leadership = Leadership(etcd, "/t", ME, ttl=2)
    try:
        stop = threading.Event()
        threading.Timer(2.0, stop.set).start()
        assert leadership.campaign(stop) and leadership.holds()
    finally:
        leadership.step_down()


def test_the_keeper_process_renews_only_while_the_coordinator_runs_and_says_so():
    coordinator = subprocess.Popen(["sleep", "60"])  # stands for the coordinator the keeper serves
    etcd = ScriptedEtcd()
    renewing = Renewing(etcd, coordinator.pid)
    try:
        renewing.take({"lease": 7, "valid_until": time.monotonic() + 2, "ttl": 2})
        report = renewing.renew()
        assert report["lease"] == 7 and report["ttl"] == 2 and 0 < etcd.calls[-1][1] <= 2, (report, etcd.calls)
        os.kill(coordinator.pid, signal.SIGSTOP)  # paused: etcd must count its lease out
        wait_for(lambda: parent_stopped(coordinator.pid))
        assert renewing.renew() is None
        os.kill(coordinator.pid, signal.SIGCONT)
        wait_for(lambda: not parent_stopped(coordinator.pid))
        assert renewing.renew() is not None
        # Running, but its leadership has not said for ACK_TTLS leases that it still runs (hung with the GIL held)
        renewing.acked_at -= ACK_TTLS * 2 + 0.1
        assert renewing.renew() is None
        renewing.take({"lease": 7, "valid_until": 0, "ttl": 2})  # it says so again
        assert renewing.renew() is not None
        renewing.take({"lease": 0, "valid_until": 0, "ttl": 2})  # stepped down
        assert renewing.renew() is None
    finally:
        os.kill(coordinator.pid, signal.SIGCONT)
        coordinator.kill()
        coordinator.wait()


def key_event(kind: str, revision: int, holder: LeaderInfo | None = None, lease: int = 0) -> dict:
    kv = {"key": b64("/t.leader"), "mod_revision": str(revision)}
    if holder is not None:
        kv.update(value=b64(holder.to_json()), lease=str(lease))
    return {"events": [{"type": kind, "kv": kv}]} if kind == "DELETE" else {"events": [{"kv": kv}]}


def test_a_leader_whose_key_a_client_deletes_steps_down_at_once():
    etcd = ScriptedEtcd()
    leadership = leading(etcd)
    lost = []
    leadership.on_lost = lost.append
    try:
        wait_for(lambda: etcd.watches == [leadership.revision + 1])  # from the revision after its own put
        etcd.watched.put({"created": True})
        etcd.watched.put(key_event("DELETE", 30))
        wait_for(lambda: leadership.lost and lost, seconds=1.0)
        assert not leadership.holds()
        assert lost == ["the key /t.leader was deleted at revision 30 while its lease held: a client of etcd "
                        "deleted it"], lost
    finally:
        leadership.step_down()


def test_a_leader_whose_key_a_client_puts_again_steps_down_at_once():
    etcd = ScriptedEtcd()
    leadership = leading(etcd)
    lost = []
    leadership.on_lost = lost.append
    try:
        wait_for(lambda: etcd.watches)
        etcd.watched.put(key_event("PUT", 31, OTHER, lease=0x1f))
        wait_for(lambda: leadership.lost and lost, seconds=1.0)
        assert lost == ["the key /t.leader was put again at revision 31, naming 10.0.0.2:7070 (lease 1f)"], lost
    finally:
        leadership.step_down()


def test_a_quiet_watch_is_checked_by_a_read_and_a_deletion_it_missed_ends_the_term(monkeypatch):
    monkeypatch.setattr(keywatch, "IDLE_SECONDS", 0.2)
    etcd = ScriptedEtcd()
    leadership = leading(etcd)
    etcd.revision = 35  # other keys were written since the leader's put
    lost = []
    leadership.on_lost = lost.append
    try:
        # Each quiet watch is followed by a read of the key, still this term's, and a watch from after that read
        wait_for(lambda: len(etcd.watches) >= 3)
        assert etcd.watches[:3] == [leadership.revision + 1, 36, 36], etcd.watches
        assert not lost and leadership.holds()
        etcd.holder, etcd.revision = None, 40  # deleted where the watch did not see it (a member that went quiet)
        wait_for(lambda: leadership.lost and lost, seconds=1.0)
        assert lost == ["the key /t.leader was deleted at revision 40 while its lease held: a client of etcd "
                        "deleted it"], lost
    finally:
        leadership.step_down()


def test_the_watch_of_an_earlier_term_does_not_end_the_next_one():
    etcd = ScriptedEtcd()
    leadership = leading(etcd)
    first = leadership.revision
    leadership.resign()
    etcd.holder = None  # resigned: the lease revoked, the key gone
    assert leadership.campaign(threading.Event())
    lost = []
    leadership.on_lost = lost.append
    try:
        assert leadership.revision != first
        leadership._key_moved(Moved(first + 1, deleted=True), first)  # what the first term's watch saw last
        assert not lost and leadership.holds() and not leadership.lost
        wait_for(lambda: etcd.watches[-1] == leadership.revision + 1)
        etcd.watched.put(key_event("DELETE", 50))
        wait_for(lambda: leadership.lost and lost, seconds=1.0)
    finally:
        leadership.step_down()
