"""Two JetStream servers joined the way fleets join them: a leaf (a city) connected to a hub (its
region) over a leafnode, the same account, each server its own JetStream domain."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from replicator.demo.local_nats import LocalNatsServer


@contextmanager
def leaf_and_hub(leaf_store: Path, hub_store: Path, leaf: str = "leaf",
                 hub: str = "hub") -> Iterator[tuple[LocalNatsServer, LocalNatsServer]]:
    """(leaf, hub), named and given JetStream domains `leaf` and `hub`; stopped on exit."""
    hub_server = LocalNatsServer(name=hub, store_dir=hub_store, domain=hub, leafnode_listen=True).start()
    try:
        leaf_server = LocalNatsServer(name=leaf, store_dir=leaf_store, domain=leaf,
                                      leafnode_remote=f"nats://127.0.0.1:{hub_server.leafnode_port}").start()
        try:
            yield leaf_server, hub_server
        finally:
            leaf_server.close()
    finally:
        hub_server.close()
