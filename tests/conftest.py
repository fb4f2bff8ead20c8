"""Shared fixtures: real nats-server processes on free loopback ports, stopped after each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import nats
import pytest
from nats.aio.client import Client

from replicator.demo.local_nats import LocalNatsServer
from tests.support.compiled_build import stale_extensions

# The fault table's report hooks: here, in the conftest every process loads (the xdist controller
# never collects tests/faults/conftest.py).
from tests.support.fault_table import pytest_runtest_logreport, pytest_terminal_summary  # noqa: F401


def pytest_configure(config: pytest.Config) -> None:
    stale = stale_extensions()
    if stale:
        pytest.exit(f"compiled from older sources: {', '.join(stale)}; `make venv` builds them again "
                    "(or delete them to test the pure-Python modules)", returncode=2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first: `make test` hands tests out one or two at a time in this order (`--dist load
    --maxschedchunk 2`), so the minute-long fault, soak and Spark tests start at once on every worker
    while short ones are left to fill the gaps, instead of one of them ending the run alone."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("spark") else 2)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--images", action="store_true", help="run tests/images against the built images (make image-test)"
    )


@pytest.fixture
def source_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNatsServer]:
    server = LocalNatsServer(name="source", store_dir=tmp_path_factory.mktemp("source-js"))
    server.start()
    yield server
    server.close()


@pytest.fixture
def target_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNatsServer]:
    server = LocalNatsServer(name="target", store_dir=tmp_path_factory.mktemp("target-js"))
    server.start()
    yield server
    server.close()


@pytest.fixture
async def source_nc(source_server: LocalNatsServer) -> AsyncIterator[Client]:
    nc = await nats.connect(source_server.url, max_reconnect_attempts=-1)
    yield nc
    await nc.close()


@pytest.fixture
async def target_nc(target_server: LocalNatsServer) -> AsyncIterator[Client]:
    nc = await nats.connect(target_server.url, max_reconnect_attempts=-1)
    yield nc
    await nc.close()
