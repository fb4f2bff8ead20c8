"""`--version` on both console scripts, run as processes: the installed distribution's version."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest


@pytest.mark.parametrize("script", ["stream-replicator", "stream-replicator-operator"])
def test_version(script: str) -> None:
    result = subprocess.run([str(Path(sys.prefix) / "bin" / script), "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{script} {metadata.version('stream-replicator')}\n"
    assert result.stderr == ""
