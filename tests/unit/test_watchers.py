"""Watchers of a job: each gets the newest status after a change, a slow one skips what it missed and holds
no backlog, and none can hold up the others."""

from __future__ import annotations

import asyncio

import pytest

from tfcluster.daemon.coordinator.rpc.watchers import TooManyWatchers, Watchers


class Job:
    def __init__(self):
        self.state, self.step = "RUNNING", 0


def follow(watchers: Watchers, jobs: dict, job_id: str = "j"):
    return watchers.follow(lambda: jobs.get(job_id), lambda job: (job.state, job.step),
                           lambda job: job.state == "SUCCEEDED")


def test_changes_reach_every_watcher_and_a_slow_one_gets_the_newest_only():
    async def scenario():
        watchers, jobs = Watchers(), {"j": Job()}
        fast, slow = follow(watchers, jobs), follow(watchers, jobs)
        assert await anext(fast) == ("RUNNING", 0) and await anext(slow) == ("RUNNING", 0)
        fast_seen = []
        for step in range(1, 101):
            jobs["j"].step = step
            watchers.changed()
            fast_seen.append(await anext(fast))
        assert fast_seen == [("RUNNING", step) for step in range(1, 101)]
        assert len(watchers) == 2  # a flag each, whatever the slow one missed
        assert await anext(slow) == ("RUNNING", 100)
        jobs["j"].state = "SUCCEEDED"
        watchers.changed()
        assert [view async for view in slow] == [("SUCCEEDED", 100)]
        await fast.aclose()
        assert len(watchers) == 0

    asyncio.run(scenario())


def test_nothing_is_sent_when_nothing_changed_and_a_removed_job_ends_the_watch():
    async def scenario():
        watchers, jobs = Watchers(refresh_seconds=0.01), {"j": Job()}
        views = follow(watchers, jobs)
        assert await anext(views) == ("RUNNING", 0)
        watchers.changed()
        waiting = asyncio.ensure_future(anext(views))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # woken and refreshed, but nothing new to send
        del jobs["j"]
        with pytest.raises(StopAsyncIteration):
            await waiting
        assert len(watchers) == 0

    asyncio.run(scenario())


def test_watchers_are_bounded():
    async def scenario():
        watchers, jobs = Watchers(limit=1), {"j": Job()}
        first = follow(watchers, jobs)
        await anext(first)
        with pytest.raises(TooManyWatchers):
            await anext(follow(watchers, jobs))
        await first.aclose()

    asyncio.run(scenario())


def test_a_follower_cancelled_as_its_job_changes_ends_and_gives_its_place_back():
    """A client that goes away just as something is stored: its call is cancelled while the flag is set. Before
    Python 3.12 asyncio.wait_for swallowed that cancellation, and the follower waited on until its job ended,
    holding its caller's place (one of --max-streams-per-caller)."""
    async def scenario():
        watchers, jobs = Watchers(refresh_seconds=60), {"j": Job()}

        async def client():
            async for _ in follow(watchers, jobs):
                pass
        following = asyncio.create_task(client())
        await asyncio.sleep(0.01)
        watchers.changed()
        following.cancel()
        await asyncio.sleep(0.1)
        done, left = following.done(), len(watchers)
        following.cancel()
        return done, left

    assert asyncio.run(scenario()) == (True, 0)
