"""User and password from files (`<side>_user_file`, `<side>_password_file`), against real servers
that require them: copying works, a wrong password fails fast with one line and never shows, and
a rotated password (the Secret updated by kubelet, or the file rewritten in place) is used at the
next reconnect without a restart, losing and duplicating nothing.

The files are laid out as kubelet mounts a `kubernetes.io/basic-auth` Secret (`username`,
`password`, each a symlink into `..data`). The test's own clients sign in as another user that the
servers accept throughout, so they can watch every step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from replicator.demo.local_nats import LocalNatsServer, free_port
from replicator.service.runner import Replicator
from tests.copier.helpers import (
    InProcess,
    make_stream,
    profile_for,
    publish_many,
    spawn,
    stop,
    write_config,
    writer_of,
)
from tests.security.conftest import (
    PASSWORD,
    USER,
    Pki,
    ServerFactory,
    assert_clean_failure,
    client_context,
    run_cli,
)
from tests.security.test_rotation import (
    OUTCOMES,
    Rotate,
    _report_outcomes,
    reconnections,
    rotate_while_copying,
    wait_reconnected,
)
from tests.security.test_secrets import _run_and_collect, _scan
from tests.support.certs import server_tls_block
from tests.support.faults import ContinuousPublisher, compare, read_stream, stream_count, wait_count
from tests.support.secret_volume import SecretVolume

__all__ = ["_report_outcomes"]  # the fault table's rows (autouse fixture)

TARGET_USER = "sr-target"
TARGET_PASSWORD = "tg-P@ss/w#rd:%?-7q"  # what a URL would need percent-encoded, as a file holds it
NEW_PASSWORD = "pw-r0tated-Kq3vX8"
ADMIN, ADMIN_PASSWORD = "test-admin", "admin-pw-5s1"  # the test's own clients


def users_block(*users: tuple[str, str]) -> str:
    entries = ", ".join(f'{{ user: "{u}", password: "{p}" }}' for u, p in users)
    return f"authorization {{ users = [ {entries} ] }}"


def basic_auth_volume(root: Path, user: str, password: str) -> SecretVolume:
    """A mounted basic-auth Secret; `kubectl create secret` from files written by `echo` ends each
    value with a line break, which is not part of it."""
    return SecretVolume(root, {"username": f"{user}\n".encode(), "password": f"{password}\n".encode()})


def files_of(side: str, volume: SecretVolume) -> dict[str, str]:
    return {f"{side}_user_file": str(volume.path("username")),
            f"{side}_password_file": str(volume.path("password"))}


def settings_for(source: LocalNatsServer, target: LocalNatsServer, **topic: Any) -> dict[str, Any]:
    return {"topics": {"fleet": {"topic": "fleet.>", "name": "sr", "source_url": source.url,
                                 "target_url": target.url, **topic}}}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_copies_with_user_and_password_from_files(tmp_path: Path, nats_server: ServerFactory,
                                                         log_format: str) -> None:
    """Both sides sign in with files; the target restarts mid-way (its reconnect reads the files
    again); logs, metrics, health, readiness and `report` (which reads the files too) never hold
    either password, and every message lands once."""
    source = nats_server("source", users_block((USER, PASSWORD)))
    target = nats_server("target", users_block((TARGET_USER, TARGET_PASSWORD)))
    source_files = basic_auth_volume(tmp_path / "source-auth", USER, PASSWORD)
    target_files = basic_auth_volume(tmp_path / "target-auth", TARGET_USER, TARGET_PASSWORD)
    settings = settings_for(source, target, **files_of("source", source_files), **files_of("target", target_files))
    source_nc = await nats.connect(source.url, user=USER, password=PASSWORD)
    target_nc = await nats.connect(target.url, user=TARGET_USER, password=TARGET_PASSWORD,
                                   max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        await make_stream(source_nc)
        await publish_many(source_nc, 200)
        outputs = await _run_and_collect(tmp_path, settings, log_format, free_port(), target, (target_nc, "FLEET"))
        outcome = compare("basic auth from files", await read_stream(source_nc, "FLEET"),
                          await read_stream(target_nc, "FLEET"), recover_s=None)
    finally:
        await source_nc.close()
        await target_nc.close()
    assert outcome.lost == outcome.duplicated == outcome.mismatched == outcome.out_of_order == 0, outcome
    leaks = _scan(outputs, {"source password": PASSWORD, "target password": TARGET_PASSWORD})
    assert not leaks, leaks
    assert "disconnected from" in outputs[f"{log_format} log"]  # the reconnect path ran
    assert "FLEET" in outputs["report"]


def _wrong_source_password(factory: ServerFactory, tmp: Path) -> tuple[dict[str, Any], str, str]:
    source, target = factory("source", users_block((USER, PASSWORD))), factory("target")
    wrong = "pw-WRONG-in-a-file-31"
    files = files_of("source", basic_auth_volume(tmp / "auth", USER, wrong))
    return settings_for(source, target, **files), "source", wrong


def _unknown_target_user(factory: ServerFactory, tmp: Path) -> tuple[dict[str, Any], str, str]:
    source, target = factory("source"), factory("target", users_block((TARGET_USER, TARGET_PASSWORD)))
    files = files_of("target", basic_auth_volume(tmp / "auth", "nobody", TARGET_PASSWORD))
    return settings_for(source, target, **files), "target", TARGET_PASSWORD


WRONG: dict[str, Callable[[ServerFactory, Path], tuple[dict[str, Any], str, str]]] = {
    "wrong-source-password": _wrong_source_password,
    "unknown-target-user": _unknown_target_user,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("log_format", ["text", "json"])
@pytest.mark.parametrize("case", list(WRONG))
def test_refused_password_exits_with_one_clear_line(tmp_path: Path, nats_server: ServerFactory, case: str,
                                                    log_format: str) -> None:
    settings, side, secret = WRONG[case](nats_server, tmp_path)
    path = write_config(tmp_path / "sr.yaml", {**settings, "log_format": log_format})
    result = run_cli("--config", str(path), "--topic", "fleet", within=30)
    assert result.seconds < 20, f"took {result.seconds:.1f}s to give up"
    assert secret not in result.stdout + result.stderr, "a password was printed"
    assert_clean_failure(result, side, "refused the credentials")


async def _copy_through(tmp: Path, source: LocalNatsServer, target: LocalNatsServer, settings: dict[str, Any],
                        rotate: Rotate, *, scenario: str, ordered: bool) -> None:
    """Copy while publishing continuously, rotate mid-way, then check the whole stream; the
    replicator runs in this process from start to end (no restart)."""
    options: dict[str, Any] = {"user": ADMIN, "password": ADMIN_PASSWORD, "max_reconnect_attempts": -1,
                               "reconnect_time_wait": 0.2}
    source_nc = await nats.connect(source.url, **options)
    target_nc = await nats.connect(target.url, **options)
    try:
        await make_stream(source_nc)
        publisher = ContinuousPublisher(source_nc, rate=200).start()
        runner = InProcess(profile_for(settings))
        async with runner as replicator:
            resumed = await rotate_while_copying(source_nc, target_nc, publisher, runner, replicator, rotate)
            assert reconnections(replicator) >= 1, "the rotation never forced a reconnect"
        outcome = compare(f"rotation: {scenario}", await read_stream(source_nc, "FLEET"),
                          await read_stream(target_nc, "FLEET"), recover_s=resumed,
                          notes=f"{reconnections(replicator):.0f} reconnections, no restart")
    finally:
        await source_nc.close()
        await target_nc.close()
    OUTCOMES.append(outcome)
    assert outcome.lost == outcome.duplicated == outcome.mismatched == 0, outcome
    if ordered:
        assert outcome.out_of_order == 0, outcome


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_password_rotated_by_kubelet_then_the_server_reloaded(tmp_path: Path, nats_server: ServerFactory,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """The Secret is updated first (kubelet swaps `..data`): the live connection is left alone.
    Then the server's config changes the password and is reloaded (`nats-server --signal reload`):
    the server ends the connections that signed in with the old one, and the reconnect reads the
    new password from the file. Source side, ordered mode."""
    caplog.set_level(logging.INFO, logger="replicator")
    source = nats_server("source", users_block((USER, PASSWORD), (ADMIN, ADMIN_PASSWORD)))
    target = nats_server("target")
    volume = basic_auth_volume(tmp_path / "source-auth", USER, PASSWORD)
    settings = settings_for(source, target, **files_of("source", volume))

    async def rotate(replicator: Replicator) -> None:
        volume.update({"password": f"{NEW_PASSWORD}\n".encode()})
        await asyncio.sleep(1.0)  # a new password alone does not drop a live connection
        assert reconnections(replicator) == 0 and replicator.readiness()[0]
        source.extra_config = users_block((USER, NEW_PASSWORD), (ADMIN, ADMIN_PASSWORD))
        await asyncio.to_thread(source.reload)
        assert await wait_reconnected(replicator)

    await _copy_through(tmp_path, source, target, settings, rotate, ordered=True,
                        scenario="password rotated by kubelet, then the server reloaded (source, ordered)")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert str(volume.path("password")) in text  # the reload was logged, by file name
    assert PASSWORD not in text and NEW_PASSWORD not in text


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_server_reloaded_first_then_the_file_rewritten(tmp_path: Path, nats_server: ServerFactory,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """The server changes the password before the file does: the connections are ended and the
    reconnects refused (warnings, never the password) until the file is rewritten in place; the
    next attempt signs in with it. Target side, scaled mode with two workers."""
    caplog.set_level(logging.INFO, logger="replicator")
    source = nats_server("source")
    target = nats_server("target", users_block((TARGET_USER, TARGET_PASSWORD), (ADMIN, ADMIN_PASSWORD)))
    password = tmp_path / "target-password"
    password.write_text(TARGET_PASSWORD)
    username = tmp_path / "target-user"
    username.write_text(TARGET_USER)
    settings = settings_for(source, target, target_user_file=str(username), target_password_file=str(password),
                            workers=2, queued=True)

    async def rotate(replicator: Replicator) -> None:
        target.extra_config = users_block((TARGET_USER, NEW_PASSWORD), (ADMIN, ADMIN_PASSWORD))
        await asyncio.to_thread(target.reload)
        await asyncio.sleep(2.5)  # reconnects with the old password are refused meanwhile
        assert not replicator.readiness()[0]
        password.write_text(NEW_PASSWORD)  # in place: same inode
        assert await wait_reconnected(replicator)

    await _copy_through(tmp_path, source, target, settings, rotate, ordered=False,
                        scenario="server reloaded, then the password file rewritten (target, scaled)")
    records = [r.getMessage() for r in caplog.records]
    assert any("authorization violation" in m.lower() for m in records), records[-20:]
    assert not [m for m in records if TARGET_PASSWORD in m or NEW_PASSWORD in m]


@pytest.mark.timeout(150)
async def test_cities_over_tls_with_password_files_fan_in_through_a_kill(tmp_path: Path, pki: Pki,
                                                                          nats_server: ServerFactory) -> None:
    """The fleet's shape: two cities whose streams share one name (FLEET) run identical config
    files (same topic and replicator name, only the URLs differ), every server speaks mutual TLS
    and asks for a user and password, each read from mounted files. One city's replicator is
    killed -9 mid-copy and started again. Every message of both cities lands once, in its city's
    order, and no log holds a password."""
    region_password = "region-P@ss/w#rd:%-9z"
    cities = [(f"city{n}", f"city{n}-pw-{n}7x") for n in (1, 2)]
    servers = {name: nats_server(name, server_tls_block(pki.server(name)) + "\n" + users_block((name, password)),
                                 scheme="tls")
               for name, password in [*cities, ("region", region_password)]}
    client = pki.client("sr")
    context = client_context(client)
    region_files = basic_auth_volume(tmp_path / "region-auth", "region", region_password)
    city_nc = {name: await nats.connect(servers[name].url, tls=context, user=name, password=password)
               for name, password in cities}
    region_nc = await nats.connect(servers["region"].url, tls=context, user="region", password=region_password)
    procs: dict[str, Any] = {}
    try:
        paths = {}
        for name, password in cities:
            await make_stream(city_nc[name])
            await publish_many(city_nc[name], 1500)  # a backlog, then continuous publishing
            city_files = basic_auth_volume(tmp_path / f"{name}-auth", name, password)
            config = {"topics": {"fleet": {
                "topic": "fleet.>", "name": "sr", "source_url": f"nats://127.0.0.1:{servers[name].port}",
                "target_url": f"nats://127.0.0.1:{servers['region'].port}",
                "tls": {"scheme": "manual", "ca": str(client.ca), "cert": str(client.cert), "key": str(client.key)},
                **files_of("source", city_files), **files_of("target", region_files)}}}
            paths[name] = write_config(tmp_path / f"{name}.yaml", config)
            procs[name] = spawn(paths[name], log_path=tmp_path / f"{name}.log")
        publishers = [ContinuousPublisher(nc, rate=300).start() for nc in city_nc.values()]  # always mid-copy
        assert await wait_count(region_nc, "FLEET", 2000, 60) is not None, (tmp_path / "city1.log").read_text()[-3000:]
        assert stop(procs["city1"], kill=True) == -9
        await asyncio.sleep(0.5)  # its city goes on publishing
        procs["city1"] = spawn(paths["city1"], log_path=tmp_path / "city1.log")
        await asyncio.sleep(1.0)
        for publisher in publishers:
            await publisher.stop()
        total = sum([await stream_count(nc, "FLEET") for nc in city_nc.values()])
        assert await wait_count(region_nc, "FLEET", total, 90) is not None, (tmp_path / "city1.log").read_text()[-3000:]
        await asyncio.sleep(1.0)  # anything duplicated would land by now
        for proc in procs.values():
            assert stop(proc) == 0
        region = await read_stream(region_nc, "FLEET")
        assert len(region) == total
        for name, _ in cities:
            writer = await writer_of(city_nc[name], "sr")
            originals = await read_stream(city_nc[name], "FLEET")
            outcome = compare("cities over TLS with password files, one killed", originals, region, recover_s=None,
                              writer=writer)
            assert outcome.lost == outcome.duplicated == outcome.mismatched == outcome.out_of_order == 0, outcome
    finally:
        for proc in procs.values():
            stop(proc, kill=True)
        for nc in [*city_nc.values(), region_nc]:
            await nc.close()
    logs = "".join((tmp_path / f"{name}.log").read_text() for name, _ in cities)
    for _, password in [*cities, ("region", region_password)]:
        assert password not in logs
