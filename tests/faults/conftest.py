"""Fault suite fixtures: the rig (servers behind proxies) and the session's results table.

Every scenario appends an `Outcome`; its rows travel in the test's report to
tests/support/fault_table.py, which prints the table in the terminal summary (so `make test` shows
it without `-s`, with or without xdist) and writes it as Markdown under the pytest cache.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from replicator.demo.local_nats import LocalNatsServer
from tests.faults.rig import Rig
from tests.support.fault_table import PROPERTY
from tests.support.faults import Outcome

RESULTS: list[Outcome] = []


@pytest.fixture(scope="session")
def fault_results() -> list[Outcome]:
    return RESULTS


@pytest.fixture(autouse=True)
def _report_outcomes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Hands this test's outcome rows to its report, where tests/support/fault_table.py finds them."""
    before = len(RESULTS)
    yield
    request.node.user_properties.extend((PROPERTY, outcome.row()) for outcome in RESULTS[before:])


@pytest.fixture
def city2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNatsServer]:
    """A second source with a same-named stream fanning into the same target (fan-in scenarios)."""
    server = LocalNatsServer(name="city2", store_dir=tmp_path_factory.mktemp("city2-js")).start()
    yield server
    server.close()


@pytest.fixture
async def rig(
    tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client,
    target_nc: Client,
) -> AsyncIterator[Rig]:
    rig = Rig(tmp_path, source_server, target_server, source_nc, target_nc, RESULTS)
    await rig.open()
    try:
        yield rig
    finally:
        await rig.close()
