"""The system tests run only under `make system-test` (STREAM_REPLICATOR_SYSTEM_TESTS=1): they start a
Prometheus, the operator and its workers, and take minutes; `make test` collects and skips them."""

from __future__ import annotations

import os

import pytest

ENABLED = os.environ.get("STREAM_REPLICATOR_SYSTEM_TESTS") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="system test: run by `make system-test`")
    for item in items:
        if "tests/system/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.system)
            # A whole install, operator, pods and Prometheus on two shared cores: minutes, not seconds.
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(600))
            if not ENABLED:
                item.add_marker(skip)
