"""Fixtures of the copier tests that more than one module uses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from replicator.demo.local_nats import LocalNatsServer
from tests.support.leafnodes import leaf_and_hub


@pytest.fixture
def region_and_city(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalNatsServer, LocalNatsServer]]:
    """(region, city): the city is a leafnode of its region, the same account, each its own JetStream domain."""
    stores = tmp_path_factory.mktemp("city"), tmp_path_factory.mktemp("region")
    with leaf_and_hub(*stores, leaf="city", hub="region") as (city, region):
        yield region, city
