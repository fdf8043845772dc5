"""Where a coordinator's store is: the store `--store` names, opened (the back-ends: sqlite.py, etcd.py, and the
contract's in-memory store)."""

from __future__ import annotations

import logging
from pathlib import Path

from tfcluster import layout
from tfcluster.daemon.coordinator.store.api import MemoryStore, Store, StoreUrlError
from tfcluster.daemon.coordinator.store.etcd import insecure_warning, open_etcd
from tfcluster.daemon.coordinator.store.etcd_gateway import EtcdTls
from tfcluster.daemon.coordinator.store.sqlite import SqliteStore

log = logging.getLogger("tfcluster.coordinator")


def open_store(url: str, state_dir: Path, etcd_tls: EtcdTls | None = None) -> Store:
    """The store --store names: sqlite:///PATH (the default: the SQLite file under the state dir), memory://
    (its documents go when the coordinator exits), or etcd://HOST:PORT,...[/PREFIX] (etcd_tls: etcd's own
    mutual TLS, or plain HTTP accepted). Raises StoreUrlError naming the flag, StoreUnavailable when etcd cannot
    be reached."""
    tls = etcd_tls or EtcdTls()
    if tls != EtcdTls() and not url.startswith("etcd://"):
        flags = "--etcd-insecure goes" if tls == EtcdTls(insecure=True) else "--etcd-ca/--etcd-cert/--etcd-key go"
        raise StoreUrlError(f"{flags} with --store etcd://..., not {url or 'the default'!r}")
    if not url:
        return SqliteStore(Path(state_dir) / layout.COORDINATOR_DB, private_dir=True)
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise StoreUrlError(f"--store {url!r}: expected a URL such as sqlite:///var/lib/tfcluster/state.sqlite3")
    if scheme == "sqlite":
        if not rest.startswith("/") or rest.endswith("/") or rest == "/":
            raise StoreUrlError(f"--store {url!r}: expected sqlite:///ABSOLUTE/PATH/TO/FILE (three slashes, then "
                                f"the database file's absolute path)")
        return SqliteStore(Path(rest))
    if scheme == "memory":
        log.warning("the state is kept in memory (--store %s): every job and node is forgotten when the "
                    "coordinator exits", url)
        return MemoryStore(rest)
    if scheme == "etcd":
        store = open_etcd(url, tls)
        if tls.insecure:
            log.warning("%s", insecure_warning(store.location))
        return store
    raise StoreUrlError(f"--store {url!r}: unknown scheme {scheme!r} (expected sqlite:///PATH, etcd://HOST:PORT,... "
                        f"or memory://)")
