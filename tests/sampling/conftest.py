"""Fixtures of the sampling tests (helpers live in helpers.py)."""

from __future__ import annotations

import pytest

from tests.sampling.helpers import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
