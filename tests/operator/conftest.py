"""Operator fixtures: the API emulator on a loopback port and the real operator embedded in the loop."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kmock
import pytest
from replication_operator.reconcile.reconciler import Reconciler
from replication_operator.settings import OperatorConfig

from tests.operator.helpers import Api
from tests.support.kube_emulator import ClusterEmulator, embedded_operator

# Short intervals so that timer-driven behaviour (Secret re-checks, lag) shows within a test.
FAST = OperatorConfig(status_interval=0.3, resync_interval=30.0, nats_timeout=2.0, pool_reload_grace=2.0)


@pytest.fixture
async def cluster() -> AsyncIterator[ClusterEmulator]:
    async with ClusterEmulator() as emulator, kmock.Server(emulator):
        yield emulator


@pytest.fixture
async def api(cluster: ClusterEmulator) -> Api:
    return Api(cluster)


@pytest.fixture
async def operator(cluster: ClusterEmulator) -> AsyncIterator[Reconciler]:
    async with embedded_operator(str(cluster.url), config=FAST) as reconciler:
        yield reconciler
