"""A registry the cluster model reads as a mapping and changes only through its owner's methods. Pure.

Nodes (core/model/node_table.py) and Jobs (core/model/job_table.py) each keep a dict of their records beside indexes over it; reading through
this read-only mapping leaves the indexes theirs alone to change. Its methods go straight to the dict, not
through Mapping's generic ones: the heartbeats of thousands of agents read them.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Generic, TypeVar

V = TypeVar("V")


class Registry(Mapping[str, V], Generic[V]):
    def __init__(self, records: dict[str, V]):
        self._records = records

    def __getitem__(self, key: str) -> V:
        return self._records[key]

    def __contains__(self, key: object) -> bool:
        return key in self._records

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: str, default: V | None = None) -> V | None:
        return self._records.get(key, default)

    def keys(self) -> KeysView[str]:
        return self._records.keys()

    def values(self) -> ValuesView[V]:
        return self._records.values()

    def items(self) -> ItemsView[str, V]:
        return self._records.items()
