"""When an agent leaves a coordinator that gave no pulse in time: only once the others say it no longer leads."""

from __future__ import annotations

import grpc

from tfcluster.leaders import LEASE_RAN_OUT, LEADER_METADATA, Coordinators, leads_elsewhere, says_of, standby_message, \
    unreachable

CURRENT = "10.0.0.1:7070"


class Answer(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, leader: str = ""):
        self._code, self._details, self._leader = code, details, leader

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return ((LEADER_METADATA, self._leader),) if self._leader else ()


def standby(leader: str) -> Answer:
    return Answer(grpc.StatusCode.UNAVAILABLE, standby_message(leader), leader)


def test_a_coordinator_the_standbys_still_name_as_leader_is_kept():
    # Behind (thousands of agents registering), not gone: leaving it would send every agent back to register again.
    assert not leads_elsewhere(CURRENT, [standby(CURRENT), standby(CURRENT)])
    silent = Answer(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    assert not leads_elsewhere(CURRENT, [standby(CURRENT), silent])
    assert not leads_elsewhere(CURRENT, [silent]), "no other answers: nobody else could serve either"
    assert not leads_elsewhere(CURRENT, [])


def test_a_coordinator_that_no_longer_leads_is_left():
    assert leads_elsewhere(CURRENT, [standby("10.0.0.2:7070")]), "a standby names another leader"
    assert leads_elsewhere(CURRENT, [standby("")]), "an election is under way: it lost its lease"
    assert leads_elsewhere(CURRENT, [standby(CURRENT), None]), "another coordinator serves"
    refused = Answer(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    assert not leads_elsewhere(CURRENT, [refused]), "a coordinator that is down says nothing about who leads"


def test_what_one_other_coordinator_says_of_the_current_one():
    # The pulse asks another coordinator, not the leader: a leader that is behind is not given more calls.
    assert says_of(CURRENT, standby(CURRENT)) is True, "a standby names it: it still leads"
    assert says_of(CURRENT, standby("10.0.0.2:7070")) is False, "a standby names another leader"
    assert says_of(CURRENT, None) is None, "the other serves: the current one itself is asked (two clusters?)"
    assert says_of(CURRENT, standby("")) is None, "an election: the current one itself is asked"
    assert says_of(CURRENT, Answer(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")) is None
    assert says_of(CURRENT, Answer(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")) is None


def test_only_a_coordinator_not_reached_at_all_is_unreachable():
    # Such a one rests from the pulse (session.Channels.rest); a coordinator that answered anything does not.
    assert unreachable(Answer(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"))
    assert unreachable(Answer(grpc.StatusCode.UNAVAILABLE, "Socket closed")), "the connection open broke"
    assert not unreachable(standby(CURRENT)) and not unreachable(standby("")), "a standby's refusal answers"
    assert not unreachable(Answer(grpc.StatusCode.UNAVAILABLE, LEASE_RAN_OUT)), "a leader whose lease ran out"
    assert not unreachable(Answer(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")), "slow, not gone"
    assert not unreachable(None), "it serves"


def test_a_standby_that_names_itself_has_just_won_and_is_kept_while_one_naming_another_is_left():
    coordinators = Coordinators(f"{CURRENT},10.0.0.2:7070,10.0.0.3:7070")
    assert not coordinators.failed(standby(CURRENT)) and coordinators.current == CURRENT  # it serves in a moment
    assert coordinators.failed(standby("10.0.0.3:7070")) and coordinators.current == "10.0.0.3:7070"
    assert coordinators.failed(Answer(grpc.StatusCode.UNAVAILABLE, "unreachable")) and \
        coordinators.current == CURRENT  # no word of a leader: the next in the list
