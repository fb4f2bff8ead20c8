"""A worker imports only what its configuration needs: no Spark, no operator, no demo, no other
mode's loop, no sampling plane without sampling, no TLS or nkey libraries without TLS or nkeys,
and no HTTP framework (a worker's memory is mostly the modules it loaded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.aio.client import Client

from replicator.demo.local_nats import LocalNatsServer, free_port
from tests.copier.helpers import make_stream

NEVER = ("pyspark", "pyarrow", "plotly", "kopf", "kubernetes", "replication_operator", "replicator.demo",
         "replicator.fleet_health", "replicator.cli.report", "replicator.cli.state", "replicator.cli.advisories",
         "aiohttp", "cryptography", "nacl", "nkeys")
SAMPLING = ("replicator.sampling.advisories", "replicator.sampling.election", "replicator.sampling.state.kv",
            "replicator.sampling.state.memory")


def loaded(tmp_path: Path, args: list[str], port: int) -> set[str]:
    out = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-m", "tests.support.worker_modules", str(port), str(out), "--", *args],
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    return set(json.loads(out.read_text()))


def imported(modules: set[str], prefix: str) -> bool:
    return any(m == prefix or m.startswith(prefix + ".") for m in modules)


def config(tmp_path: Path, source: LocalNatsServer, target: LocalNatsServer, port: int, **extra: Any) -> Path:
    path = tmp_path / "sr.yaml"
    path.write_text(yaml.safe_dump({"topics": {"fleet": {"topic": "fleet.>", "source_url": source.url,
                                                         "target_url": target.url, "monitor": port, **extra}}}))
    return path


async def test_an_ordered_worker_loads_no_other_mode_and_no_sampling_plane(
        tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client) -> None:
    await make_stream(source_nc)
    port = free_port()
    path = config(tmp_path, source_server, target_server, port)
    modules = loaded(tmp_path, ["--config", str(path), "--topic", "fleet"], port)
    assert "replicator.copier.ordered" in modules  # it did run
    unwanted = [p for p in (*NEVER, *SAMPLING, "replicator.copier.scaled", "replicator.heartbeats",
                            "replicator.observe.gometrics") if imported(modules, p)]
    assert unwanted == []


@pytest.mark.parametrize("command", ["run", "replicate"])
async def test_a_sampling_scaled_worker_loads_its_plane_and_not_the_ordered_loop(
        tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client,
        command: str) -> None:
    await make_stream(source_nc)
    port = free_port()
    path = config(tmp_path, source_server, target_server, port, workers=2, inspect="sender", age="1h",
                  limiter_state="kv", advisory={"target": "sr.advisories"})
    args = ["--config", str(path), "--topic", "fleet"] if command == "run" else ["replicate", "--config", str(path)]
    modules = loaded(tmp_path, args, port)
    assert all(imported(modules, p) for p in (*SAMPLING, "replicator.copier.scaled"))
    assert [p for p in (*NEVER, "replicator.copier.ordered") if imported(modules, p)] == []
