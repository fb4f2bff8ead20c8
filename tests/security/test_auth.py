"""Authentication: user/password and token in the URL, `.creds` files (operator mode); wrong ones fail
fast with one line naming the side, never retry in silence, never print the secret."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import nats
import pytest

from replicator.demo.local_nats import LocalNatsServer
from tests.copier.helpers import make_stream, publish_many, spawn, stop, write_config
from tests.security.conftest import PASSWORD, TOKEN, USER, ServerFactory, assert_clean_failure, run_cli
from tests.support.faults import compare, read_stream, wait_count
from tests.support.nats_jwt import Decentralised


def users_block(user: str = USER, password: str = PASSWORD) -> str:
    return f'authorization {{ users = [ {{ user: "{user}", password: "{password}" }} ] }}'


def token_block(token: str = TOKEN) -> str:
    return f'authorization {{ token: "{token}" }}'


def with_userinfo(server: LocalNatsServer, userinfo: str) -> str:
    return f"nats://{userinfo}@127.0.0.1:{server.port}"


def config(source_url: str, target_url: str, **topic: Any) -> dict[str, Any]:
    return {"topics": {"fleet": {"topic": "fleet.>", "name": "sr", "source_url": source_url,
                                 "target_url": target_url, **topic}}}


async def _copy_and_compare(tmp_path: Path, settings: dict[str, Any], source: dict[str, Any],
                            target: dict[str, Any]) -> None:
    """Copy 300 messages with `settings`; `source`/`target` are `nats.connect` arguments for the
    test's own clients on each side."""
    source_nc = await nats.connect(**source)
    target_nc = await nats.connect(**target)
    try:
        await make_stream(source_nc)
        await publish_many(source_nc, 300)
        path = write_config(tmp_path / "sr.yaml", settings)
        proc = spawn(path, log_path=tmp_path / "worker.log")
        try:
            took = await wait_count(target_nc, "FLEET", 300, 30)
            assert took is not None, (tmp_path / "worker.log").read_text()[-3000:]
        finally:
            assert stop(proc) == 0
        outcome = compare("auth", await read_stream(source_nc, "FLEET"), await read_stream(target_nc, "FLEET"),
                          recover_s=None)
        assert outcome.lost == outcome.duplicated == outcome.mismatched == 0, outcome
    finally:
        await source_nc.close()
        await target_nc.close()


@pytest.mark.timeout(60)
async def test_user_password_and_token_in_the_urls(tmp_path: Path, nats_server: ServerFactory) -> None:
    source = nats_server("source", users_block())
    target = nats_server("target", token_block())
    source_url = with_userinfo(source, f"{USER}:{PASSWORD}")
    target_url = with_userinfo(target, TOKEN)
    await _copy_and_compare(tmp_path, config(source_url, target_url), {"servers": source_url}, {"servers": target_url})


@pytest.mark.timeout(60)
async def test_password_with_url_special_characters(tmp_path: Path, nats_server: ServerFactory) -> None:
    """Generated passwords contain `@ / # ? %`; in a URL they are percent-encoded, and the server
    must receive the decoded password (nats-py alone would send `%40` literally)."""
    password = "p@ss/w#rd?50%-x"
    source = nats_server("source", users_block(password=password))
    target = nats_server("target", token_block("t/k@n#1"))
    source_url = with_userinfo(source, f"{USER}:{quote(password, safe='')}")
    target_url = with_userinfo(target, quote("t/k@n#1", safe=""))
    await _copy_and_compare(tmp_path, config(source_url, target_url),
                            {"servers": source.url, "user": USER, "password": password},
                            {"servers": target.url, "token": "t/k@n#1"})


@pytest.mark.timeout(60)
async def test_creds_files_in_operator_mode(tmp_path: Path, nats_server: ServerFactory) -> None:
    """Decentralised auth (operator, account, user JWTs) on both sides, via `*_credentials` files."""
    source_auth, target_auth = Decentralised.create(), Decentralised.create()
    source = nats_server("source", source_auth.server_config())
    target = nats_server("target", target_auth.server_config())
    source_creds = source_auth.write_creds(tmp_path / "source.creds")
    target_creds = target_auth.write_creds(tmp_path / "target.creds")
    settings = config(source.url, target.url, source_credentials=str(source_creds),
                      target_credentials=str(target_creds))
    await _copy_and_compare(tmp_path, settings, {"servers": source.url, "user_credentials": str(source_creds)},
                            {"servers": target.url, "user_credentials": str(target_creds)})


def _wrong_password(factory: ServerFactory, tmp: Path) -> tuple[dict[str, Any], str, str]:
    source = factory("source", users_block())
    target = factory("target", token_block())
    wrong = "pw-WRONG-7c1d"
    return config(with_userinfo(source, f"{USER}:{wrong}"), with_userinfo(target, TOKEN)), "source", wrong


def _wrong_token(factory: ServerFactory, tmp: Path) -> tuple[dict[str, Any], str, str]:
    source = factory("source", users_block())
    target = factory("target", token_block())
    wrong = "tok-WRONG-5e4f"
    return config(with_userinfo(source, f"{USER}:{PASSWORD}"), with_userinfo(target, wrong)), "target", wrong


def _no_credentials(factory: ServerFactory, tmp: Path) -> tuple[dict[str, Any], str, str]:
    source = factory("source", users_block())
    target = factory("target")
    return config(source.url, target.url), "source", PASSWORD


def _creds_of_another_operator(factory: ServerFactory, tmp: Path) -> tuple[dict[str, Any], str, str]:
    trusted, stranger = Decentralised.create(), Decentralised.create()
    source = factory("source")
    target = factory("target", trusted.server_config())
    creds = stranger.write_creds(tmp / "stranger.creds")
    seed = stranger.user.seed.decode()
    return config(source.url, target.url, target_credentials=str(creds)), "target", seed


WRONG = {
    "wrong-password": _wrong_password,
    "wrong-token": _wrong_token,
    "no-credentials": _no_credentials,
    "creds-of-another-operator": _creds_of_another_operator,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(WRONG))
def test_wrong_credentials_exit_with_one_clear_line(tmp_path: Path, nats_server: ServerFactory,
                                                    case: str) -> None:
    settings, side, secret = WRONG[case](nats_server, tmp_path)
    path = write_config(tmp_path / "sr.yaml", settings)
    result = run_cli("--config", str(path), "--topic", "fleet", within=30)
    assert result.seconds < 20, f"took {result.seconds:.1f}s to give up"
    assert secret not in result.stdout + result.stderr, "a secret was printed"
    assert_clean_failure(result, side, "refused the credentials")
