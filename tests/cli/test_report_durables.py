"""`report` lists the durables a replicator created on a source stream that no profile of the file
owns any more (renamed, switched mode, removed): on interest or work-queue retention each holds
the stream's messages for ever."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig

from replicator.demo.local_nats import LocalNatsServer
from tests.copier.helpers import (
    InProcess,
    make_stream,
    profile_for,
    publish_many,
    topic_config,
    wait_for_count,
    write_config,
)


async def test_report_lists_durables_no_profile_owns(tmp_path: Path, source_server: LocalNatsServer,
                                                     target_server: LocalNatsServer, source_nc: Client,
                                                     target_nc: Client) -> None:
    await make_stream(source_nc)
    await publish_many(source_nc, 10)
    old = topic_config(source_server.url, target_server.url, name="old")
    async with InProcess(profile_for(old)):
        assert await wait_for_count(target_nc, "FLEET", 10) == 10
    # Not a replicator's: a consumer somebody else made is none of report's business.
    await source_nc.jetstream().add_consumer("FLEET", ConsumerConfig(durable_name="audit",
                                                                     ack_policy=AckPolicy.EXPLICIT))
    renamed = topic_config(source_server.url, target_server.url, name="new")
    async with InProcess(profile_for(renamed)):
        await publish_many(source_nc, 5, start=10)
        assert await wait_for_count(target_nc, "FLEET", 25) == 25  # a new name is a new writer: copied again
    path = write_config(tmp_path / "sr.yaml", renamed)
    out = subprocess.run([sys.executable, "-m", "replicator", "report", "--config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"Durables no profile of {path} owns" in out.stdout and "FLEET/old" in out.stdout, out.stdout
    assert "FLEET/new" not in out.stdout and "audit" not in out.stdout.split("owns")[-1]
