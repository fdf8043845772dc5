"""How long an agent's pulse leaves a coordinator it could not reach (session.Channels): 2 s, doubled at each try
in a row that fails, up to 30 s, each jittered by half either way; one that answers starts again at 2 s."""

from __future__ import annotations

import socket

from tfcluster.daemon.agent.session.session import REST_FIRST_SECONDS, REST_SECONDS, Channels

ADDRESS = "127.0.0.1:1"


def rests(channels: Channels, tries: int) -> list[float]:
    out = []
    for _ in range(tries):
        channels.rest(ADDRESS)
        out.append(channels.rest_left(ADDRESS))
    return out


def test_the_rest_doubles_at_each_failed_try_up_to_its_bound():
    got = rests(Channels(owner=None), 8)
    for tries, rest in enumerate(got, start=1):
        base = min(REST_SECONDS, REST_FIRST_SECONDS * 2 ** (tries - 1))
        assert 0.5 * base - 0.01 <= rest <= 1.5 * base, (tries, rest)
    assert max(got[5:]) <= 1.5 * REST_SECONDS


def test_a_coordinator_down_for_days_is_still_rested_and_one_that_answers_starts_again():
    channels = Channels(owner=None)
    rests(channels, 5000)  # 30 s each: about two days of tries
    assert 0.5 * REST_SECONDS - 0.01 <= channels.rest_left(ADDRESS) <= 1.5 * REST_SECONDS
    channels.reached(ADDRESS)
    channels.rest(ADDRESS)
    assert channels.rest_left(ADDRESS) <= 1.5 * REST_FIRST_SECONDS


def test_after_its_rest_a_coordinator_is_watched_only_once_it_takes_a_tcp_connection():
    channels = Channels(owner=None)
    assert channels.reachable(ADDRESS, 1.0), "one never rested is not probed"
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        channels.rest(address)
        first = channels.rest_left(address)
        assert not channels.reachable(address, 1.0), "a refused connection"
        assert channels.rest_left(address) > 0 and channels.failed_tries[address] == 2, "rested again, longer"
        assert first <= 1.5 * REST_FIRST_SECONDS
    with socket.create_server(("127.0.0.1", 0)) as listening:
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        channels.rest(address)
        assert channels.reachable(address, 1.0) and not channels.rest_left(address)
