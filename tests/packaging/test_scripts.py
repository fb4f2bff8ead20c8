"""The shell scripts the images and CI use, checked by shellcheck (Debian package `shellcheck`)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from dockerfile_support import REPO

SCRIPTS = ["images/spark-entrypoint", "images/bootstrap-base", ".ci/run"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_shellcheck(script: str) -> None:
    path = REPO / script
    assert path.is_file()
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck; .ci/run installs it)")
    result = subprocess.run(
        [shellcheck, "--severity=style", "--shell=bash", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
