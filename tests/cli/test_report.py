from __future__ import annotations

import datetime as dt
import subprocess
import sys

from replicator.cli.report import ReportRow, first_certificate, format_report
from tests.copier.helpers import (
    InProcess,
    make_stream,
    profile_for,
    publish_many,
    topic_config,
    wait_for_count,
    write_config,
)
from tests.support.certs import CertificateAuthority, write_client


async def test_report_shows_streams_consumer_lag_and_errors(tmp_path, source_server, target_server, source_nc,
                                                            target_nc):
    await make_stream(source_nc)
    await publish_many(source_nc, 100)
    config = topic_config(source_server.url, target_server.url)
    config["topics"]["broken"] = {"topic": "nothing.here", "source_url": source_server.url,
                                  "target_url": target_server.url}
    path = write_config(tmp_path / "sr.yaml", config)
    async with InProcess(profile_for(config)):
        assert await wait_for_count(target_nc, "FLEET", 100) == 100
    await publish_many(source_nc, 25, start=100)
    result = subprocess.run([sys.executable, "-m", "replicator", "report", "--config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert "| Topic" in lines[1] and "Lag" in lines[1] and "Last Active" in lines[1] and "Cert Expiry" in lines[1]
    fleet = next(line for line in lines if line.startswith("| fleet "))
    assert "| FLEET " in fleet and "| sr " in fleet and "| 25 " in fleet and "ago" in fleet
    assert "| batch " in fleet  # the replicator created the target with allow_batched
    broken = next(line for line in lines if line.startswith("| broken "))
    assert "no source stream captures subject 'nothing.here'" in broken


def test_report_shows_the_first_certificate_to_expire(tmp_path):
    """Client and CA certificates of both sides, read from the files as they are now."""
    ca = CertificateAuthority.create("report-ca", days=40)
    client = write_client(ca, tmp_path / "tls", "sr")
    leaf = ca.issue("sr", client=True, days=9)
    leaf.write(client.cert, client.key)
    config = topic_config("nats://127.0.0.1:1", "nats://127.0.0.1:2")
    config["topics"]["fleet"]["source_tls"] = {"ca": str(client.ca), "cert": str(client.cert), "key": str(client.key)}
    config["topics"]["fleet"]["target_tls"] = {"ca": str(client.ca)}
    certificate = first_certificate(profile_for(config))
    assert certificate == (leaf.cert.not_valid_after_utc.timestamp(), "source client")
    now = dt.datetime.now(dt.UTC)
    assert "| 8d (source client) |" in format_report([ReportRow("fleet", certificate=certificate)], now)
    later = now + dt.timedelta(days=10)
    assert "| EXPIRED (source client) |" in format_report([ReportRow("fleet", certificate=certificate)], later)
    assert "| - " in format_report([ReportRow("fleet")], now)
