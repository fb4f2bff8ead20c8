"""TLS end to end with generated certificates; every TLS mistake ends the process with one clear line.

Both servers require client certificates (`verify: true`). The good paths copy real messages in
both layouts (`manual` per side with two different CAs, and `puppet`); the bad ones (wrong CA,
expired certificates on either end, a client certificate from an unknown CA, none at all, a host
name the certificate does not cover, a server without TLS, an unusable key) must each exit
non-zero quickly, naming the side and the TLS problem: never hang, never print a traceback, never
fall back to plaintext.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from nats.aio.client import Client, Srv

from replicator.demo.local_nats import LocalNatsServer, free_port
from replicator.transport import reads
from replicator.transport.connections import _FirstConnect, permanent_reason
from replicator.transport.reads import ChunkReader
from replicator.transport.tls_probe import handshake_alert
from tests.copier.helpers import (
    InProcess,
    make_stream,
    profile_for,
    publish_many,
    spawn,
    stop,
    write_config,
)
from tests.security.conftest import Pki, ServerFactory, assert_clean_failure, client_context, run_cli, tls_server
from tests.support.certs import TlsFiles, write_puppet
from tests.support.faults import compare, read_stream, wait_count


def manual(files: TlsFiles) -> dict[str, str]:
    return {"scheme": "manual", "ca": str(files.ca), "cert": str(files.cert), "key": str(files.key)}


def config(source: LocalNatsServer, target: LocalNatsServer, **topic: Any) -> dict[str, Any]:
    # nats:// on purpose: configuring TLS must switch the scheme to tls:// by itself.
    base = {"topic": "fleet.>", "name": "sr", "source_url": f"nats://127.0.0.1:{source.port}",
            "target_url": f"nats://127.0.0.1:{target.port}"}
    return {"topics": {"fleet": {**base, **topic}}}


@pytest.mark.timeout(90)
async def test_tls_manual_layout_per_side_end_to_end(
    tmp_path: Path, pki: Pki, nats_server: ServerFactory, connect_tls: Callable[..., Any]
) -> None:
    """Source and target clusters with different CAs: `source_tls` and `target_tls` each name their
    own CA, certificate and key. The real CLI copies everything and stops cleanly."""
    source = tls_server(nats_server, "source", pki.server("source"))
    target = tls_server(nats_server, "target", pki.server("target", ca=pki.other_ca))
    src_client = pki.client("sr-source")
    tgt_client = pki.client("sr-target", ca=pki.other_ca)
    source_nc = await connect_tls(source, src_client)
    target_nc = await connect_tls(target, tgt_client)
    await make_stream(source_nc)
    await publish_many(source_nc, 500, headers={"X-Tls": "yes"})
    path = write_config(tmp_path / "sr.yaml", config(source, target, source_tls=manual(src_client),
                                                     target_tls=manual(tgt_client)))
    proc = spawn(path, log_path=tmp_path / "worker.log")
    try:
        took = await wait_count(target_nc, "FLEET", 500, 30)
        assert took is not None, (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        assert stop(proc) == 0
    originals, copies = await read_stream(source_nc, "FLEET"), await read_stream(target_nc, "FLEET")
    outcome = compare("tls manual", originals, copies, recover_s=None)
    assert outcome.lost == outcome.duplicated == outcome.mismatched == outcome.out_of_order == 0, outcome


async def test_tls_connections_read_through_the_chunk_reader(
    pki: Pki, nats_server: ServerFactory, connect_tls: Callable[..., Any]
) -> None:
    """After the TLS upgrade the connection still reads through `ChunkReader` (TLS records end
    reads mid-message), and 16 KB messages with headers arrive whole and in order."""
    reads.install()
    server = tls_server(nats_server, "chunks", pki.server("chunks"))
    nc = await connect_tls(server, pki.client("sr-chunks"))
    assert nc._transport._io_reader is not nc._transport._bare_io_reader  # upgraded
    assert isinstance(nc._transport._io_reader, ChunkReader)
    sub = await nc.subscribe("t.>")
    payloads = [bytes([i]) * 16384 for i in range(100)]
    for i, payload in enumerate(payloads):
        await nc.publish(f"t.{i}", payload, headers={"N": str(i)})
    got = [await sub.next_msg(timeout=5) for _ in payloads]
    assert [m.headers["N"] for m in got] == [str(i) for i in range(100)]
    assert [m.data for m in got] == payloads


@pytest.mark.timeout(60)
async def test_tls_puppet_layout(
    tmp_path: Path, pki: Pki, nats_server: ServerFactory, connect_tls: Callable[..., Any]
) -> None:
    """The legacy Puppet layout: ssl_dir/certs/ca.pem, certs/<identity>.pem, private_keys/<identity>.pem."""
    source = tls_server(nats_server, "source", pki.server("source"))
    target = tls_server(nats_server, "target", pki.server("target"))
    ssl_dir = tmp_path / "puppet-ssl"
    write_puppet(pki.ca, ssl_dir, "sr1.example.net")
    client = pki.client("test-client")
    source_nc = await connect_tls(source, client)
    target_nc = await connect_tls(target, client)
    await make_stream(source_nc)
    await publish_many(source_nc, 200)
    settings = config(source, target)
    settings["tls"] = {"scheme": "puppet", "ssl_dir": str(ssl_dir), "identity": "sr1.example.net"}
    async with InProcess(profile_for(settings)):
        assert await wait_count(target_nc, "FLEET", 200, 20) is not None


def _case_wrong_ca(pki: Pki, factory: ServerFactory) -> tuple[dict[str, Any], tuple[str, ...]]:
    """We trust another CA than the one that signed the server's certificate."""
    source = tls_server(factory, "source", pki.server("source"))
    target = tls_server(factory, "target", pki.server("target"))
    return config(source, target, tls=manual(pki.client("sr", trust=pki.other_ca))), (
        "source", "cannot verify the server's certificate")


def _case_expired_client(pki: Pki, factory: ServerFactory) -> tuple[dict[str, Any], tuple[str, ...]]:
    source = tls_server(factory, "source", pki.server("source"))
    target = tls_server(factory, "target", pki.server("target"))
    return config(source, target, tls=manual(pki.client("sr", expired=True))), (
        "source", "rejected our client certificate", "expired")


def _case_expired_server(pki: Pki, factory: ServerFactory) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The source is fine; the target's own certificate has expired."""
    source = tls_server(factory, "source", pki.server("source"))
    target = tls_server(factory, "target", pki.server("target", expired=True))
    return config(source, target, tls=manual(pki.client("sr"))), (
        "target", "cannot verify the server's certificate", "expired")


def _case_unknown_client_ca(pki: Pki, factory: ServerFactory) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Our certificate comes from a CA the target does not know (we trust the right CA)."""
    source = tls_server(factory, "source", pki.server("source"))
    target = tls_server(factory, "target", pki.server("target"))
    good = pki.client("sr")
    rogue = pki.client("sr-rogue", ca=pki.other_ca, trust=pki.ca)
    return config(source, target, source_tls=manual(good), target_tls=manual(rogue)), (
        "target", "rejected our client certificate", "unknown ca")


def _case_no_client_cert(pki: Pki, factory: ServerFactory) -> tuple[dict[str, Any], tuple[str, ...]]:
    source = tls_server(factory, "source", pki.server("source"))
    target = tls_server(factory, "target", pki.server("target"))
    return config(source, target, tls={"scheme": "manual", "ca": str(pki.client("sr").ca)}), (
        "source", "rejected our client certificate")


def _case_wrong_host(pki: Pki, factory: ServerFactory) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The certificate is valid and trusted, but for another address than the one we dial."""
    source = tls_server(factory, "source", pki.server("source", ips=("10.11.12.13",)))
    target = tls_server(factory, "target", pki.server("target"))
    return config(source, target, tls=manual(pki.client("sr"))), (
        "source", "cannot verify the server's certificate", "mismatch")


def _case_plaintext_server(pki: Pki, factory: ServerFactory) -> tuple[dict[str, Any], tuple[str, ...]]:
    """TLS is configured but the target does not offer it: refuse, never send CONNECT in the clear."""
    source = tls_server(factory, "source", pki.server("source"))
    target = factory("target", f'authorization {{ user: "u", password: "{"pw-never-in-clear"}" }}')
    settings = config(source, target, tls=manual(pki.client("sr")))
    settings["topics"]["fleet"]["target_url"] = f"nats://u:pw-never-in-clear@127.0.0.1:{target.port}"
    return settings, ("target", "does not offer TLS")


def _case_bad_key(pki: Pki, factory: ServerFactory) -> tuple[dict[str, Any], tuple[str, ...]]:
    source = tls_server(factory, "source", pki.server("source"))
    target = tls_server(factory, "target", pki.server("target"))
    files = pki.client("sr")
    files.key.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    return config(source, target, tls=manual(files)), ("source", "TLS files unusable")


CASES = {
    "wrong-ca": _case_wrong_ca,
    "expired-client-cert": _case_expired_client,
    "expired-server-cert": _case_expired_server,
    "client-cert-unknown-ca": _case_unknown_client_ca,
    "no-client-cert": _case_no_client_cert,
    "wrong-host": _case_wrong_host,
    "plaintext-server": _case_plaintext_server,
    "unusable-key": _case_bad_key,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(CASES))
def test_tls_mistakes_exit_with_one_clear_line(tmp_path: Path, pki: Pki, nats_server: ServerFactory,
                                               case: str) -> None:
    settings, needles = CASES[case](pki, nats_server)
    path = write_config(tmp_path / "sr.yaml", settings)
    result = run_cli("--config", str(path), "--topic", "fleet", within=30)
    assert result.seconds < 20, f"took {result.seconds:.1f}s to give up"
    assert "pw-never-in-clear" not in result.stdout + result.stderr
    assert_clean_failure(result, *needles)


@pytest.mark.timeout(30)
async def test_plaintext_server_never_sees_credentials_when_tls_is_configured(
    tmp_path: Path, pki: Pki, nats_server: ServerFactory
) -> None:
    """A fake server that offers no TLS: the replicator must hang up before sending CONNECT (which
    carries user and password), instead of nats-py's silent fallback to plaintext."""
    received = bytearray()

    async def fake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b'INFO {"server_id":"fake","version":"2.15.1","proto":1,"max_payload":1048576,'
                     b'"auth_required":true,"headers":true}\r\n')
        await writer.drain()
        try:
            while chunk := await asyncio.wait_for(reader.read(4096), 5):
                received.extend(chunk)
        except (TimeoutError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(fake, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = tls_server(nats_server, "target", pki.server("target"))
    settings = config(target, target, tls=manual(pki.client("sr")))
    settings["topics"]["fleet"]["source_url"] = f"nats://u:pw-on-the-wire@127.0.0.1:{port}"
    from replicator.transport.connections import ConnectError, connect

    with pytest.raises(ConnectError, match="does not offer TLS"):
        await asyncio.wait_for(connect(profile_for(settings), "source", "sr_0"), 10)
    server.close()
    assert b"pw-on-the-wire" not in received and b"CONNECT" not in received, bytes(received)


@pytest.mark.timeout(30)
async def test_a_reset_first_connect_is_explained_by_a_handshake_that_sends_nothing(
    pki: Pki, nats_server: ServerFactory
) -> None:
    """Over TLS 1.3 a server that rejects our certificate may reset the connection instead of
    saying why (nats-py's CONNECT was unread when it closed). The probe hears the alert; with an
    accepted certificate, or nothing listening, it hears nothing and the retries go on."""
    server = tls_server(nats_server, "target", pki.server("target"))
    rogue = client_context(pki.client("sr-rogue", ca=pki.other_ca, trust=pki.ca))
    alert = await handshake_alert("127.0.0.1", server.port, rogue)
    assert alert is not None
    reason = permanent_reason(alert)
    assert reason is not None and "rejected our client certificate" in reason and "unknown ca" in reason, reason
    good = client_context(pki.client("sr"))
    assert await handshake_alert("127.0.0.1", server.port, good, timeout=0.5) is None
    assert await handshake_alert("127.0.0.1", free_port(), good, timeout=0.5) is None


@pytest.mark.timeout(30)
async def test_a_reset_first_connect_to_a_server_that_rejects_us_ends_with_the_reason(
    pki: Pki, nats_server: ServerFactory
) -> None:
    """The first connect's judgement asks the probe when a TLS server reset it: the reset (which
    the race above makes rare, so it is handed in here) ends the attempt with the server's reason
    instead of retrying for ever."""
    server = tls_server(nats_server, "target", pki.server("target"))
    rogue = client_context(pki.client("sr-rogue", ca=pki.other_ca, trust=pki.ca))
    attempt = _FirstConnect({"servers": [server.url], "tls": rogue}, Client, "target", "sr_0", None, None)
    attempt.nc = Client()
    attempt.nc.options["tls"] = rogue
    attempt.nc._current_server = Srv(urlparse(server.url))
    attempt.fatal = asyncio.get_running_loop().create_future()
    await attempt.error_cb(ConnectionResetError(104, "Connection reset by peer"))
    assert attempt.fatal.done() and "unknown ca" in attempt.fatal.result(), attempt.last_error
