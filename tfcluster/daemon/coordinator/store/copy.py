"""`tfcluster coordinator migrate-store`: every document of one store copied into another, with the coordinator
stopped. The documents are brought to this release's shape first (migrate.py, in the source), then put in the
target in batches the target's write splits as it must; the copy is read back and compared before it is called
done. A target that already holds documents is refused unless the caller says to replace them: two clusters'
states mixed under one prefix would be neither.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from tfcluster.daemon.coordinator.store import migrate
from tfcluster.daemon.coordinator.store.api import Delete, Document, Put, Store

BATCH = 500  # documents per write: a store that bounds its transactions (etcd) splits each further


class TargetNotEmpty(RuntimeError):
    pass


@dataclass(frozen=True)
class Copied:
    documents: int
    by_kind: dict[str, int]
    replaced: int  # documents the target held before, deleted


def copy_store(source: Store, target: Store, replace: bool = False) -> Copied:
    documents = migrate.upgrade(source)
    existing = target.load()
    if existing and not replace:
        raise TargetNotEmpty(f"{target.location} holds {len(existing)} documents already: give --force to replace "
                             f"them with {source.location}'s")
    for batch in _batches([Delete(d.kind, d.key, d.revision) for d in existing]):
        target.write(batch)
    for batch in _batches([Put(d.kind, d.key, d.body) for d in documents]):
        target.write(batch)
    _verify(documents, target)
    by_kind: dict[str, int] = {}
    for d in documents:
        by_kind[d.kind] = by_kind.get(d.kind, 0) + 1
    return Copied(len(documents), by_kind, len(existing))


def _batches(writes: list) -> Iterator[list]:
    for start in range(0, len(writes), BATCH):
        yield writes[start:start + BATCH]


def _verify(documents: list[Document], target: Store) -> None:
    """The target holds exactly the source's documents, body for body."""
    wanted = {(d.kind, d.key): d.body for d in documents}
    found = {(d.kind, d.key): d.body for d in target.load()}
    if found != wanted:
        differ = sorted(k for k in wanted.keys() | found.keys() if wanted.get(k) != found.get(k))
        raise RuntimeError(f"{target.location} does not hold what was copied: {len(differ)} documents differ, "
                           f"e.g. {differ[0][0]} {differ[0][1]!r}")
