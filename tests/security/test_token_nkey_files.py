"""Token and bare-nkey authentication from files (`<side>_token_file`, `<side>_nkey_file`), against
real servers that require them: the worker copies with the secrets read from files laid out as
kubelet mounts a Secret, and neither the token nor the seed appears in its config, its URLs, its
logs, metrics, health, readiness or `report`. A wrong token fails fast with one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nats
import pytest

from replicator.config import ConfigError, load_config
from replicator.demo.local_nats import free_port
from tests.copier.helpers import make_stream, publish_many, write_config
from tests.security.conftest import ServerFactory, assert_clean_failure, run_cli
from tests.security.test_secrets import _run_and_collect, _scan
from tests.support.faults import compare, read_stream
from tests.support.nats_jwt import Key
from tests.support.secret_volume import SecretVolume

TOKEN = "tk-s3cr3t-Zq81/+x"
ADMIN, ADMIN_PASSWORD = "test-admin", "admin-pw-5s1"  # the test's own clients


def token_block(token: str) -> str:
    return f'authorization {{ token: "{token}" }}'


def nkey_block(public: str) -> str:
    """The worker signs in with the nkey; the test's own client with a password."""
    return (f'authorization {{ users = [ {{ nkey: "{public}" }}, '
            f'{{ user: "{ADMIN}", password: "{ADMIN_PASSWORD}" }} ] }}')


def _settings(source_url: str, target_url: str, **topic: Any) -> dict[str, Any]:
    return {"topics": {"fleet": {"topic": "fleet.>", "name": "sr", "source_url": source_url,
                                 "target_url": target_url, **topic}}}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_copies_with_a_token_file_and_an_nkey_seed_file(tmp_path: Path, nats_server: ServerFactory,
                                                               log_format: str) -> None:
    user = Key.create("user")
    seed = user.seed.decode()
    source = nats_server("source", token_block(TOKEN))
    target = nats_server("target", nkey_block(user.public))
    token_volume = SecretVolume(tmp_path / "source-auth", {"token": f"{TOKEN}\n".encode()})
    nkey_volume = SecretVolume(tmp_path / "target-auth", {"nkey.seed": f"{seed}\n".encode()})
    settings = _settings(source.url, target.url, source_token_file=str(token_volume.path("token")),
                         target_nkey_file=str(nkey_volume.path("nkey.seed")))
    config_text = write_config(tmp_path / "shown.yaml", settings).read_text()
    assert TOKEN not in config_text and seed not in config_text  # the config names files only
    source_nc = await nats.connect(source.url, token=TOKEN)
    target_nc = await nats.connect(target.url, user=ADMIN, password=ADMIN_PASSWORD,
                                   max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        await make_stream(source_nc)
        await publish_many(source_nc, 200)
        outputs = await _run_and_collect(tmp_path, settings, log_format, free_port(), target, (target_nc, "FLEET"))
        outcome = compare("token and nkey files", await read_stream(source_nc, "FLEET"),
                          await read_stream(target_nc, "FLEET"), recover_s=None)
    finally:
        await source_nc.close()
        await target_nc.close()
    assert outcome.lost == outcome.duplicated == outcome.mismatched == outcome.out_of_order == 0, outcome
    leaks = _scan(outputs, {"token": TOKEN, "nkey seed": seed})
    assert not leaks, leaks
    assert "disconnected from" in outputs[f"{log_format} log"]  # the reconnect read the seed file again


@pytest.mark.timeout(60)
def test_a_refused_token_exits_with_one_clear_line(tmp_path: Path, nats_server: ServerFactory) -> None:
    source, target = nats_server("source", token_block(TOKEN)), nats_server("target")
    wrong = "tk-WRONG-in-a-file-77"
    volume = SecretVolume(tmp_path / "auth", {"token": wrong.encode()})
    path = write_config(tmp_path / "sr.yaml", _settings(source.url, target.url,
                                                        source_token_file=str(volume.path("token"))))
    result = run_cli("--config", str(path), "--topic", "fleet", within=30)
    assert result.seconds < 20, f"took {result.seconds:.1f}s to give up"
    assert wrong not in result.stdout + result.stderr, "a token was printed"
    assert_clean_failure(result, "source", "refused the credentials")


def test_one_way_to_authenticate_a_side(tmp_path: Path) -> None:
    settings = _settings("nats://127.0.0.1:4222", "nats://127.0.0.1:4223", source_token_file="/t",
                         source_nkey_file="/n")
    with pytest.raises(ConfigError, match="one way to authenticate the source"):
        load_config(write_config(tmp_path / "sr.yaml", settings))
