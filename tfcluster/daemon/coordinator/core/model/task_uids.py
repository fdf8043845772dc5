"""The user each job's tasks run as: one UID per job, from a configured range, like systemd's DynamicUser. Pure.

The coordinator picks it, so a job has the same UID on every node and on shared storage, and no passwd entry
is needed. The GID is the same number. A job's first candidate follows from its number, so the choice is
deterministic; candidates held by a live job are skipped (two jobs never share a UID while both live), and so,
while the range allows, are those of ended jobs still kept, whose files may still be around.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_FIRST = 2_100_000_000  # above SSSD's default id-mapping range (200000-2000200000)
DEFAULT_LAST = 2_100_999_999
MAX_UID = 2**31 - 1  # tools that store IDs as signed 32-bit numbers break above it


class RangeExhausted(Exception):
    """Every UID of the range is held by a live job."""


@dataclass(frozen=True)
class UidRange:
    first: int = DEFAULT_FIRST
    last: int = DEFAULT_LAST

    def __post_init__(self) -> None:
        if not 1 <= self.first <= self.last <= MAX_UID:
            raise ValueError(f"task UID range {self.first}-{self.last}: expected 1 <= FIRST <= LAST <= {MAX_UID}")

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def __contains__(self, uid: int) -> bool:
        return self.first <= uid <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


def parse_range(text: str) -> UidRange:
    """`FIRST-LAST` -> UidRange; ValueError naming what is wrong."""
    first, sep, last = text.strip().partition("-")
    if not sep or not first.strip().isdigit() or not last.strip().isdigit():
        raise ValueError(f"expected FIRST-LAST (two UIDs), got {text!r}")
    return UidRange(int(first), int(last))


def allocate(number: int, uids: UidRange, held_by_live: Callable[[int], bool],
             held_by_ended: Callable[[int], bool]) -> int:
    """The UID of job `number`: the first candidate from its own place in the range that no job holds, else the
    first that no live job holds. Raises RangeExhausted when every UID is live."""
    start = (max(number, 1) - 1) % uids.size
    fallback = 0
    for step in range(uids.size):
        uid = uids.first + (start + step) % uids.size
        if held_by_live(uid):
            continue
        if not held_by_ended(uid):
            return uid
        fallback = fallback or uid
    if fallback:
        return fallback
    raise RangeExhausted(f"every task UID of the range {uids} is held by a live job; widen --task-uid-range")
