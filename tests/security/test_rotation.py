"""Rotation without a restart: certificates, CA bundles and credentials replaced while the replicator
copies, against real servers that require client certificates.

Each scenario rotates the replicator's material the way it happens in production (kubelet's
`..data` swap of a Secret volume, an in-place rewrite, a rename over the file), then makes the old
material unacceptable to the server (a `pinned_certs` reload, a restart with another client CA, a
new server certificate, a revoked user). Copying must continue with the new material in the same
replicator (no restart), with 0 lost and 0 duplicated, and 0 out of order in ordered mode.

The test's own clients use an identity the servers accept throughout (the "admin" CA in every
client-CA bundle, its own pin, its own user), so they can watch every step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client, RawCredentials
from prometheus_client.parser import text_string_to_metric_families

from replicator.demo.local_nats import LocalNatsServer
from replicator.service.runner import Replicator
from tests.copier.helpers import InProcess, make_stream, profile_for
from tests.security.conftest import ServerFactory
from tests.support.certs import (
    CertificateAuthority,
    Issued,
    TlsFiles,
    bundle,
    cert_pem,
    key_pem,
    server_tls_block,
    spki_sha256,
)
from tests.support.fault_table import PROPERTY
from tests.support.faults import ContinuousPublisher, Outcome, compare, read_stream, stream_count, wait_count
from tests.support.nats_jwt import Decentralised, Key
from tests.support.secret_volume import SecretVolume

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

OUTCOMES: list[Outcome] = []


@pytest.fixture(autouse=True)
def _report_outcomes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each scenario's row joins the fault results table (tests/support/fault_table.py)."""
    before = len(OUTCOMES)
    yield
    request.node.user_properties.extend((PROPERTY, outcome.row()) for outcome in OUTCOMES[before:])


@dataclass
class Cluster:
    """One TLS server (client certificates required) whose trust the test changes."""

    dir: Path
    server_ca: CertificateAuthority
    client_cas: list[CertificateAuthority]
    pinned: list[str] = field(default_factory=list)
    extra: str = ""
    server: LocalNatsServer | None = None

    def configure(self) -> str:
        issued = self.server_ca.issue(self.dir.name, server=True, client=True)
        cert, key = issued.write(self.dir / "server.pem", self.dir / "server-key.pem")
        (self.dir / "client-cas.pem").write_bytes(bundle(*self.client_cas))
        files = TlsFiles(self.dir / "client-cas.pem", cert, key)
        return server_tls_block(files, pinned=tuple(self.pinned)) + self.extra

    def start(self, factory: ServerFactory) -> LocalNatsServer:
        self.server = factory(self.dir.name, self.configure(), scheme="tls")
        return self.server

    def restart(self) -> None:
        """With the current settings: every connection drops and must come back."""
        assert self.server is not None
        self.server.extra_config = self.configure()
        self.server.restart()

    def reload(self) -> None:
        """With the current settings, connections kept (unless no longer pinned)."""
        assert self.server is not None
        self.server.extra_config = self.configure()
        self.server.reload()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"nats://127.0.0.1:{self.server.port}"


@dataclass
class Env:
    tmp: Path
    factory: ServerFactory
    server_ca: CertificateAuthority = field(default_factory=lambda: CertificateAuthority.create("server-ca-1"))
    new_server_ca: CertificateAuthority = field(
        default_factory=lambda: CertificateAuthority.create("server-ca-2", days=60))
    client_ca: CertificateAuthority = field(default_factory=lambda: CertificateAuthority.create("client-ca-1"))
    new_client_ca: CertificateAuthority = field(default_factory=lambda: CertificateAuthority.create("client-ca-2"))
    admin_ca: CertificateAuthority = field(default_factory=lambda: CertificateAuthority.create("admin-ca"))

    def __post_init__(self) -> None:
        self.admin = self.admin_ca.issue("test-admin", client=True)

    def cluster(self, name: str, **kw: Any) -> Cluster:
        (self.tmp / name).mkdir(parents=True, exist_ok=True)
        return Cluster(self.tmp / name, self.server_ca, [self.admin_ca, self.client_ca], **kw)

    def started(self, source: dict[str, Any] | None = None,
                target: dict[str, Any] | None = None) -> tuple[Cluster, Cluster]:
        """The source and target servers, running (keyword arguments of `cluster` for each)."""
        pair = self.cluster("source", **(source or {})), self.cluster("target", **(target or {}))
        for cluster in pair:
            cluster.start(self.factory)
        return pair

    def admin_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=bundle(self.server_ca, self.new_server_ca).decode())
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = self.admin.write(Path(tmp) / "admin.pem", Path(tmp) / "admin-key.pem")
            ctx.load_cert_chain(str(cert), str(key))
        return ctx

    def files(self, name: str, issued: Issued, *cas: CertificateAuthority) -> dict[str, Path]:
        """Plain files (rewritten in place by the scenario)."""
        directory = self.tmp / name
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = issued.write(directory / "tls.crt", directory / "tls.key")
        (directory / "ca.crt").write_bytes(bundle(*(cas or (self.server_ca,))))
        return {"ca": directory / "ca.crt", "cert": cert, "key": key}

    def volume(self, name: str, issued: Issued) -> SecretVolume:
        """A kubelet-style Secret volume (rotated with `..data` swaps)."""
        return SecretVolume(self.tmp / name, {"ca.crt": self.server_ca.pem, "tls.crt": cert_pem(issued.cert),
                                              "tls.key": key_pem(issued.key)})


def tls(paths: dict[str, Path]) -> dict[str, str]:
    return {"scheme": "manual", **{k: str(v) for k, v in paths.items()}}


def volume_tls(volume: SecretVolume) -> dict[str, str]:
    return tls({"ca": volume.path("ca.crt"), "cert": volume.path("tls.crt"), "key": volume.path("tls.key")})


def settings_for(source: Cluster, target: Cluster, **topic: Any) -> dict[str, Any]:
    base = {"topic": "fleet.>", "name": "sr", "source_url": source.url, "target_url": target.url}
    return {"topics": {"fleet": {**base, **topic}}}


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def gauge(samples: dict, name: str, **labels: str) -> list[float]:
    return [v for (n, lbl), v in samples.items() if n == name and labels.items() <= dict(lbl).items()]


def not_after(cert: Any) -> float:
    return float(cert.not_valid_after_utc.timestamp())


Rotate = Callable[[Replicator], Awaitable[None]]


@contextlib.asynccontextmanager
async def watching(env: Env, source: Cluster, target: Cluster,
                   source_auth: dict[str, Any] | None = None) -> AsyncIterator[tuple[Client, Client]]:
    ctx = env.admin_context()
    options = {"tls": ctx, "max_reconnect_attempts": -1, "reconnect_time_wait": 0.2}
    source_nc = await nats.connect(source.url, **options, **(source_auth or {}))
    target_nc = await nats.connect(target.url, **options)
    try:
        yield source_nc, target_nc
    finally:
        await source_nc.close()
        await target_nc.close()


def reconnections(replicator: Replicator) -> float:
    return sum(replicator.metrics.registry.get_sample_value(
        "stream_replicator_connection_reconnections_total", {"name": replicator.profile.metrics_name,
                                                             "worker": w.name}) or 0 for w in replicator.workers)


async def rotate_while_copying(source_nc: Client, target_nc: Client, publisher: ContinuousPublisher,
                               runner: InProcess, replicator: Replicator, rotate: Rotate) -> float:
    """Rotate once 100 copies landed; then copying must resume, take everything the publisher sent
    and leave the replicator running. Returns the seconds it took to resume."""
    assert await wait_count(target_nc, "FLEET", 100, 30) is not None, "copying never started"
    await rotate(replicator)
    mark = await stream_count(source_nc, "FLEET")
    resumed = await wait_count(target_nc, "FLEET", mark + 100, 30)
    assert resumed is not None, "copying stopped"
    await publisher.stop()
    total = await stream_count(source_nc, "FLEET")
    assert await wait_count(target_nc, "FLEET", total, 30) is not None, "not everything arrived"
    assert runner.task is not None and not runner.task.done(), "the replicator stopped"
    return resumed


async def copy_through(env: Env, source: Cluster, target: Cluster, settings: dict[str, Any], rotate: Rotate,
                       *, scenario: str, ordered: bool = True, source_auth: dict[str, Any] | None = None,
                       unique_keys: bool = False) -> dict:
    """Copy while publishing continuously, rotate mid-way, then check the whole stream; returns the
    replicator's metrics as scraped at the end. The outcome joins the fault results table."""
    async with watching(env, source, target, source_auth) as (source_nc, target_nc):
        await make_stream(source_nc)
        await make_stream(source_nc, "ADVISORIES", ["sr.advisories"])
        body = (lambda i: json.dumps({"id": i}).encode()) if unique_keys else None
        publisher = ContinuousPublisher(source_nc, rate=200, make_body=body).start()
        runner = InProcess(profile_for(settings), monitor_port=0)
        async with runner as replicator:
            resumed = await rotate_while_copying(source_nc, target_nc, publisher, runner, replicator, rotate)
            assert replicator.monitor is not None
            samples = await asyncio.to_thread(scrape, replicator.monitor.port)
        outcome = compare(f"rotation: {scenario}", await read_stream(source_nc, "FLEET"),
                          await read_stream(target_nc, "FLEET"), recover_s=resumed,
                          notes=f"{reconnections(replicator):.0f} reconnections, no restart")
    OUTCOMES.append(outcome)
    assert outcome.lost == outcome.duplicated == outcome.mismatched == 0, outcome
    if ordered:
        assert outcome.out_of_order == 0, outcome
    assert sum(gauge(samples, "stream_replicator_connection_reconnections_total")) >= 1
    return samples


async def test_leaf_renewed_under_the_same_ca_then_the_old_one_refused(tmp_path: Path,
                                                                       nats_server: ServerFactory) -> None:
    """cert-manager renews the leaf (kubelet swaps `..data`): the live connection stays up; then the
    target pins only the new certificate and drops the old connection; the reconnect presents the
    new one. Target side, ordered mode."""
    env = Env(tmp_path, nats_server)
    old = env.client_ca.issue("sr", client=True)
    new = env.client_ca.issue("sr", client=True, days=14)
    source, target = env.started(target={"pinned": [spki_sha256(env.admin.cert), spki_sha256(old.cert)]})
    volume = env.volume("target-tls", old)
    settings = settings_for(source, target, source_tls=tls(env.files("source-tls", old)),
                            target_tls=volume_tls(volume))

    async def rotate(replicator: Replicator) -> None:
        volume.update({"tls.crt": cert_pem(new.cert), "tls.key": key_pem(new.key)})
        await asyncio.sleep(1.0)  # a renewal alone does not drop a live connection
        assert reconnections(replicator) == 0 and replicator.readiness()[0]
        target.pinned = [spki_sha256(env.admin.cert), spki_sha256(new.cert)]
        target.reload()

    samples = await copy_through(env, source, target, settings, rotate,
                                 scenario="leaf renewed, old unpinned (target, ordered)")
    assert gauge(samples, "stream_replicator_certificate_expiry_timestamp_seconds", side="target",
                 certificate="client") == [not_after(new.cert)]


async def test_client_ca_rotated(tmp_path: Path, nats_server: ServerFactory) -> None:
    """The source accepts only client certificates of a new CA after a restart; the files were
    rewritten in place. Source side, scaled mode with KV limiter state, advisories on the source
    and the advisory election: the worker, control, KV and election connections all come back."""
    env = Env(tmp_path, nats_server)
    old = env.client_ca.issue("sr", client=True)
    source, target = env.started()
    files = env.files("source-tls", old)
    settings = settings_for(source, target, source_tls=tls(files), target_tls=tls(env.files("target-tls", old)),
                            workers=2, queued=True, inspect="id", age="1h", limiter_state="kv",
                            advisory={"target": "sr.advisories", "cluster": "source"})

    async def rotate(replicator: Replicator) -> None:
        new = env.new_client_ca.issue("sr", client=True)
        files["cert"].write_bytes(cert_pem(new.cert))  # in place: same inode
        files["key"].write_bytes(key_pem(new.key))
        source.client_cas = [env.admin_ca, env.new_client_ca]
        source.restart()

    await copy_through(env, source, target, settings, rotate, ordered=False, unique_keys=True,
                       scenario="client CA rotated (source, scaled, KV, advisories)")


async def test_server_ca_bundle_rotated_with_overlap(tmp_path: Path, nats_server: ServerFactory) -> None:
    """The target moves to a certificate from a new CA: our bundle first holds both CAs, the server
    restarts with the new certificate, then the old CA leaves the bundle and the server restarts
    again. Target side, ordered mode, kubelet `..data` swaps."""
    env = Env(tmp_path, nats_server)
    leaf = env.client_ca.issue("sr", client=True)
    source, target = env.started()
    volume = env.volume("target-tls", leaf)
    settings = settings_for(source, target, source_tls=tls(env.files("source-tls", leaf)),
                            target_tls=volume_tls(volume))

    async def rotate(replicator: Replicator) -> None:
        volume.update({"ca.crt": bundle(env.server_ca, env.new_server_ca)})
        target.server_ca = env.new_server_ca
        target.restart()
        assert await wait_reconnected(replicator)  # verified the new server with the overlapping bundle
        volume.update({"ca.crt": env.new_server_ca.pem})
        target.restart()

    samples = await copy_through(env, source, target, settings, rotate,
                                 scenario="server CA bundle rotated (target, ordered)")
    assert gauge(samples, "stream_replicator_certificate_expiry_timestamp_seconds", side="target",
                 certificate="ca") == [not_after(env.new_server_ca.cert)]


async def test_creds_rotated_and_the_old_user_revoked(tmp_path: Path, nats_server: ServerFactory) -> None:
    """Operator mode with the `full` resolver on a TLS source: the `.creds` file is replaced (a
    rename over it), then the account is pushed with the old user revoked, which ends every live
    connection of that user. Source side, ordered mode with leader election (control connection)."""
    env = Env(tmp_path, nats_server)
    leaf = env.client_ca.issue("sr", client=True)
    auth = Decentralised.create()
    (tmp_path / "jwt").mkdir()
    source, target = env.started(source={"extra": auth.server_config(tmp_path / "jwt")})
    creds = auth.write_creds(tmp_path / "source.creds")
    admin = Key.create("user")
    settings = settings_for(source, target, source_tls=tls(env.files("source-tls", leaf)),
                            target_tls=tls(env.files("target-tls", leaf)), source_credentials=str(creds),
                            leader_election=True, leader_election_ttl="3s")

    async def rotate(replicator: Replicator) -> None:
        old = auth.rotate_user()
        fresh = tmp_path / "source.creds.new"
        fresh.write_text(auth.creds_text())
        os.replace(fresh, creds)
        auth.revoke(old)
        await auth.push_account(source.url, tls=env.admin_context())

    await copy_through(env, source, target, settings, rotate,
                       scenario=".creds rotated, old user revoked (source, election)",
                       source_auth={"user_credentials": RawCredentials(auth.creds_text(admin))})


async def test_half_written_file_keeps_the_last_good_material(tmp_path: Path, nats_server: ServerFactory,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A rotation caught half-way (new key written, certificate cut short): a reconnect then uses the
    last good material and one warning names the file; once the certificate is complete and the
    server accepts only the new CA, the reconnect presents it. Source side, ordered mode."""
    env = Env(tmp_path, nats_server)
    old = env.client_ca.issue("sr", client=True)
    source, target = env.started()
    files = env.files("source-tls", old)
    settings = settings_for(source, target, source_tls=tls(files), target_tls=tls(env.files("target-tls", old)))
    new = env.new_client_ca.issue("sr", client=True)
    caplog.set_level(logging.INFO, logger="replicator")

    async def rotate(replicator: Replicator) -> None:
        files["key"].write_bytes(key_pem(new.key))
        files["cert"].write_bytes(cert_pem(new.cert)[:300])
        source.restart()  # still accepts the old CA: the reconnect must present the old certificate
        assert await wait_reconnected(replicator)
        files["cert"].write_bytes(cert_pem(new.cert))
        source.client_cas = [env.admin_ca, env.new_client_ca]
        source.restart()

    samples = await copy_through(env, source, target, settings, rotate,
                                 scenario="half-written file during rotation (source, ordered)")
    warnings = [r.getMessage() for r in caplog.records if r.name.endswith("material") and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(files["cert"]) in warnings[0], warnings
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "BEGIN" not in text and key_pem(new.key).decode().splitlines()[1] not in text
    assert gauge(samples, "stream_replicator_certificate_expiry_timestamp_seconds", side="source",
                 certificate="client") == [not_after(new.cert)]


async def wait_reconnected(replicator: Replicator, within: float = 20.0) -> bool:
    """Every worker connected again (and bound) after an outage."""
    deadline = time.monotonic() + within
    await asyncio.sleep(0.2)
    while time.monotonic() < deadline:
        if replicator.readiness()[0]:
            return True
        await asyncio.sleep(0.1)
    return False
