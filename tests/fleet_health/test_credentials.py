"""The fleet-health job's connections read `--credentials` as the replicator does: a rotated file
is used from the next (re)connect on, also by a connection the server cut off for a revoked user."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import nats
import pytest
from nats.aio.client import RawCredentials
from pyspark.sql import SparkSession

from replicator.demo.local_nats import LocalNatsServer
from replicator.fleet_health.jetstream import connect, stream_bounds
from tests.support.nats_jwt import Decentralised, Key

pytestmark = pytest.mark.spark


async def _fill(url: str, creds: str) -> None:
    nc = await nats.connect(url, user_credentials=RawCredentials(creds))
    try:
        js = nc.jetstream()
        await js.add_stream(name="ADV", subjects=["adv.>"])
        for i in range(20):
            await js.publish(f"adv.{i}", f"payload-{i}".encode())
    finally:
        await nc.close()


async def _rotate_while_connected(url: str, auth: Decentralised, creds: Path) -> int:
    """Connected with the old user: rotate the file, revoke the old user, read again."""
    nc = await connect(url, str(creds), name="fleet-health-test")
    try:
        old = auth.rotate_user()
        fresh = creds.with_suffix(".new")
        fresh.write_text(auth.creds_text())
        os.replace(fresh, creds)
        auth.revoke(old)
        await auth.push_account(url)
        for _ in range(100):  # the server cuts the revoked user off; the client comes back as the new one
            await asyncio.sleep(0.1)
            if nc.stats["reconnects"] and nc.is_connected:
                break
        assert nc.is_connected and nc.stats["reconnects"] == 1
        return (await stream_bounds(nc, "ADV")).messages
    finally:
        await nc.close()


def test_reader_credentials_rotate(spark: SparkSession, tmp_path: Path) -> None:
    auth = Decentralised.create()
    (tmp_path / "jwt").mkdir()
    server = LocalNatsServer(name="adv", store_dir=tmp_path / "store",
                             extra_config=auth.server_config(tmp_path / "jwt")).start()
    try:
        creds = auth.write_creds(tmp_path / "reader.creds")
        asyncio.run(_fill(server.url, auth.creds_text(Key.create("user"))))

        def read() -> list[int]:
            df = (spark.read.format("jetstream").option("url", server.url).option("stream", "ADV")
                  .option("credentials", str(creds)).option("partitions", "2").load())
            return sorted(r.sequence for r in df.collect())

        assert asyncio.run(_rotate_while_connected(server.url, auth, creds)) == 20
        assert read() == list(range(1, 21))  # planner and executors: the new user (the old one is revoked)
    finally:
        server.close()
