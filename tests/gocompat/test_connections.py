"""The Go format's connection settings against real servers: `choria: {jwt_file, seed_file}` (a NATS
user JWT and its nkey seed), `?jwt=&nkey=` and `?credentials=` in URLs, all against a server in
operator mode (operator, account and user JWTs); and the URL's TLS options against a TLS server
that wants the handshake first and has a certificate we were given no CA for."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import RawCredentials
from nats.js.api import StreamConfig

from replicator.config import Profile, parse_config
from replicator.demo.local_nats import LocalNatsServer
from replicator.service.process import ReplicatorProcess
from replicator.transport.connections import ConnectError
from tests.support.certs import CertificateAuthority, server_tls_block, write_client, write_server
from tests.support.faults import read_stream, wait_count
from tests.support.nats_jwt import Decentralised, Key

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def operator_mode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalNatsServer, Decentralised, Path]]:
    auth = Decentralised.create()
    files = tmp_path_factory.mktemp("jwt")
    server = LocalNatsServer(name="jwt", store_dir=tmp_path_factory.mktemp("jwt-js"), extra_config=auth.server_config())
    server.start()
    (files / "user.jwt").write_text(auth.user_jwt() + "\n")
    (files / "user.nk").write_text(auth.user.seed.decode() + "\n")
    (files / "user.nk").chmod(0o600)
    auth.write_creds(files / "user.creds")
    (files / "admin.creds").write_text(auth.creds_text(Key.create("user")))  # the test's own user
    (files / "other.nk").write_text(Key.create("user").seed.decode())
    yield server, auth, files
    server.close()


def _users_of(server: LocalNatsServer, prefix: str) -> set[str]:
    """The NATS users (public nkeys) the replicator's connections are signed in as."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/connz?auth=true", timeout=5) as reply:
        connections = json.load(reply)["connections"]
    return {c.get("authorized_user", "") for c in connections if c.get("name", "").startswith(prefix)}


async def _replicate(config: dict[str, Any]) -> None:
    parsed = parse_config(config, "go.yaml")
    process = ReplicatorProcess(parsed, [Profile(parsed, p, source="go.yaml") for p in parsed.topics])
    await process.run()


@pytest.mark.parametrize("how", ["choria", "choria-per-side", "url-jwt", "url-credentials"])
async def test_jwt_and_credentials_settings_authenticate(operator_mode: tuple[LocalNatsServer, Decentralised, Path],
                                                         how: str) -> None:
    """Each way signs in as the user it names; `target_choria` wins over the top-level `choria` on
    its side only (the server's connection list says who each connection is)."""
    server, auth, files = operator_mode
    stream = f"JWT_{how.replace('-', '_').upper()}"
    root = stream.lower()
    url = server.url
    top: dict[str, Any] = {}
    side: dict[str, Any] = {}
    users = {auth.user.public}
    if how.startswith("choria"):
        top["choria"] = {"jwt_file": str(files / "user.jwt"), "seed_file": str(files / "user.nk"),
                         "collective": "choria"}
    if how == "choria-per-side":
        other = Key.create("user")
        (files / "target.jwt").write_text(auth.user_jwt(other))
        (files / "target.nk").write_bytes(other.seed)
        side["target_choria"] = {"jwt_file": str(files / "target.jwt"), "seed_file": str(files / "target.nk")}
        users.add(other.public)
    elif how == "url-jwt":
        url += f"?jwt={files / 'user.jwt'}&nkey={files / 'user.nk'}"
    elif how == "url-credentials":
        url += f"?credentials={files / 'user.creds'}"
    nc = await nats.connect(server.url, user_credentials=str(files / "admin.creds"))
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=stream, subjects=[f"{root}.>"]))
        for i in range(30):
            await js.publish(f"{root}.x", str(i).encode())
        config = {"name": how.upper(), **top, "streams": [{
            "stream": stream, "target_stream": f"{stream}_COPY", "target_subject_prefix": "copy", "source_url": url,
            "target_url": url, **side}]}
        task = asyncio.ensure_future(_replicate(config))
        try:
            assert await wait_count(nc, f"{stream}_COPY", 30, 20) is not None
            assert _users_of(server, f"SR_{how.upper()}_{stream}") == users
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert [m.data for m in await read_stream(nc, f"{stream}_COPY")] == [str(i).encode() for i in range(30)]
    finally:
        await nc.close()


async def test_a_seed_that_does_not_match_the_jwt_fails_at_once(
        operator_mode: tuple[LocalNatsServer, Decentralised, Path]) -> None:
    server, _, files = operator_mode
    config = {"name": "SITE", "choria": {"jwt_file": str(files / "user.jwt"), "seed_file": str(files / "other.nk")},
              "streams": [{"stream": "NOPE", "source_url": server.url, "target_url": server.url}]}
    with pytest.raises(ConnectError, match=r"user\.jwt: the user JWT belongs to another nkey than the seed") as err:
        await asyncio.wait_for(_replicate(config), 30)
    assert "SU" not in str(err.value)  # no seed in the message


async def test_rotated_jwt_and_seed_files_are_used_at_the_next_reconnect(tmp_path: Path) -> None:
    """`choria: {jwt_file, seed_file}` go through the reloading material like a `.creds` file: a new
    user's JWT and seed replace the files, the old user is revoked (which ends its connections), and
    the reconnects sign in as the new user; nothing lost or copied twice, no restart."""
    auth = Decentralised.create()
    (tmp_path / "resolver").mkdir()
    server = LocalNatsServer(name="jwt-rotate", store_dir=tmp_path / "js",
                             extra_config=auth.server_config(tmp_path / "resolver"))
    server.start()
    jwt, seed = tmp_path / "user.jwt", tmp_path / "user.nk"
    jwt.write_text(auth.user_jwt() + "\n")
    seed.write_bytes(auth.user.seed + b"\n")
    admin = Key.create("user")
    nc = await nats.connect(server.url, user_credentials=RawCredentials(auth.creds_text(admin)))
    config = {"name": "ROT", "choria": {"jwt_file": str(jwt), "seed_file": str(seed)},
              "streams": [{"stream": "ROT", "target_stream": "ROT_COPY", "target_subject_prefix": "copy",
                           "source_url": server.url, "target_url": server.url}]}
    task = asyncio.ensure_future(_replicate(config))
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="ROT", subjects=["rot.>"]))
        for i in range(20):
            await js.publish("rot.x", str(i).encode())
        assert await wait_count(nc, "ROT_COPY", 20, 20) is not None
        old = auth.rotate_user()
        for path, content in ((jwt, auth.user_jwt().encode()), (seed, auth.user.seed)):
            fresh = path.with_suffix(".new")
            fresh.write_bytes(content + b"\n")
            os.replace(fresh, path)
        auth.revoke(old)
        await auth.push_account(server.url)
        for i in range(20, 40):
            await js.publish("rot.x", str(i).encode())
        assert await wait_count(nc, "ROT_COPY", 40, 30) is not None, "copying did not resume as the new user"
        assert [m.data for m in await read_stream(nc, "ROT_COPY")] == [str(i).encode() for i in range(40)]
        assert _users_of(server, "SR_ROT_ROT") == {auth.user.public}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await nc.close()
        server.close()


async def test_url_tls_options_handshake_first_and_insecure(tmp_path: Path) -> None:
    ca = CertificateAuthority.create("unknown-to-the-replicator")
    tls = write_server(ca, tmp_path / "tls", "server")
    server = LocalNatsServer(name="tls-first", store_dir=tmp_path / "js", scheme="tls", extra_config=(
        f'tls {{\n  cert_file: "{tls.cert}"\n  key_file: "{tls.key}"\n  handshake_first: true\n  timeout: 2\n}}\n'))
    server.start()
    try:
        url = f"nats://127.0.0.1:{server.port}?tls_handshake_first=true&insecure=true&connect_timeout=3s"
        config = {"name": "SITE", "streams": [{"stream": "TLSFIRST", "target_stream": "TLSFIRST_COPY",
                                               "target_subject_prefix": "copy", "source_url": url,
                                               "target_url": url}]}
        import ssl

        ctx = ssl.create_default_context(cafile=str(tls.ca))
        nc = await nats.connect(f"tls://127.0.0.1:{server.port}", tls=ctx, tls_handshake_first=True)
        try:
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name="TLSFIRST", subjects=["tlsfirst.>"]))
            for i in range(10):
                await js.publish("tlsfirst.x", str(i).encode())
            task = asyncio.ensure_future(_replicate(config))
            try:
                assert await wait_count(nc, "TLSFIRST_COPY", 10, 20) is not None
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            # Without `insecure`, the server's certificate (from a CA we were not given) is refused.
            strict = {**config, "streams": [{**config["streams"][0],  # type: ignore[index]
                                             "source_url": url.replace("&insecure=true", "")}]}
            with pytest.raises(ConnectError, match="cannot verify the server's certificate"):
                await asyncio.wait_for(_replicate(strict), 30)
        finally:
            await nc.close()
    finally:
        server.close()


async def test_tls_blocks_reach_every_stream_and_the_most_specific_wins(tmp_path: Path) -> None:
    """Against a server that requires client certificates: the top-level `tls` block serves a
    stream that has none; a stream whose own `tls` names a CA that cannot verify the server still
    connects, because its `source_tls` and `target_tls` win."""
    import ssl

    ca = CertificateAuthority.create("go-tls")
    server = LocalNatsServer(name="go-tls", store_dir=tmp_path / "js", scheme="tls",
                             extra_config=server_tls_block(write_server(ca, tmp_path / "server", "server")))
    server.start()
    client = write_client(ca, tmp_path / "client", "sr")
    good = {"ca": str(client.ca), "cert": str(client.cert), "key": str(client.key)}
    stranger = CertificateAuthority.create("stranger").write_ca(tmp_path / "stranger-ca.pem")
    ctx = ssl.create_default_context(cafile=str(client.ca))
    ctx.load_cert_chain(str(client.cert), str(client.key))
    nc = await nats.connect(server.url, tls=ctx)
    try:
        js = nc.jetstream()
        for name in ("GTLS", "STLS"):
            await js.add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"]))
            for i in range(10):
                await js.publish(f"{name.lower()}.x", str(i).encode())
        common = {"source_url": server.url, "target_url": server.url, "target_subject_prefix": "copy"}
        config = {"name": "TLS", "tls": good, "streams": [
            {"stream": "GTLS", "target_stream": "GTLS_COPY", **common},
            {"stream": "STLS", "target_stream": "STLS_COPY", "tls": {"ca": str(stranger)}, "source_tls": good,
             "target_tls": good, **common}]}
        task = asyncio.ensure_future(_replicate(config))
        try:
            for name in ("GTLS", "STLS"):
                assert await wait_count(nc, f"{name}_COPY", 10, 20) is not None, name
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        # Without its side blocks, the stream's own `tls` (a CA that cannot verify the server) applies.
        only_stream = {**config, "streams": [{k: v for k, v in config["streams"][1].items()  # type: ignore[index]
                                              if k not in ("source_tls", "target_tls")}]}
        with pytest.raises(ConnectError, match="cannot verify the server's certificate"):
            await asyncio.wait_for(_replicate(only_stream), 30)
    finally:
        await nc.close()
        server.close()
