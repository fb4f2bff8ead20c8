"""A user name file and a password file as connection material: parsed as text, rotated like every
other file (kubelet's `..data` swap, an in-place rewrite), a half-written one keeps the last good
pair, and no message or repr ever holds the password.

No servers here: `tests/security/test_basic_auth.py` proves the reconnects against real ones.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from replicator.transport.material import MaterialError, MaterialFiles, MaterialSource, build
from tests.support.secret_volume import SecretVolume

PASSWORD = "pw-r0tate-Me-4y7"
NEW_PASSWORD = "pw-n3w-0ne-8k2"


def basic_files(volume: SecretVolume) -> MaterialFiles:
    return MaterialFiles(username=str(volume.path("username")), password=str(volume.path("password")))


def test_values_are_the_files_text_without_their_line_break() -> None:
    files = MaterialFiles(username="/u", password="/p")
    basic = build(files, {"username": b"sr\n", "password": f"{PASSWORD}\r\n".encode()}).basic
    assert basic is not None and (basic.user, basic.password) == ("sr", PASSWORD)
    spaced = build(files, {"username": b"sr", "password": b" a b "}).basic  # inner and outer spaces are kept
    assert spaced is not None and spaced.password == " a b "
    material = build(files, {"username": b"sr", "password": PASSWORD.encode()})
    assert PASSWORD not in repr(material) and PASSWORD not in repr(material.basic)
    assert build(MaterialFiles(), {}).basic is None


@pytest.mark.parametrize(("data", "where", "reason"), [
    ({"username": b"sr"}, "/u", "a username needs a password too"),
    ({"password": PASSWORD.encode()}, "/p", "a password needs a username too"),
    ({"username": b"sr", "password": b""}, "/p", "is empty (incomplete?)"),
    ({"username": b"\n", "password": b"x"}, "/u", "is empty (incomplete?)"),
    ({"username": b"sr", "password": b"\xff\xfe"}, "/p", "not UTF-8 text"),
])
def test_unusable_files_are_named_never_shown(data: dict[str, bytes], where: str, reason: str) -> None:
    with pytest.raises(MaterialError) as err:
        build(MaterialFiles(username="/u", password="/p"), data)
    assert err.value.where == where and reason in err.value.reason
    assert PASSWORD not in str(err.value)


def test_a_rotated_secret_is_read_at_the_next_check(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """kubelet swaps `..data`: the next connect gets the new password; an unchanged file is not
    parsed again; the log names the file only."""
    caplog.set_level(logging.INFO, logger="replicator")
    volume = SecretVolume(tmp_path / "basic-auth", {"username": b"sr", "password": PASSWORD.encode()})
    source = MaterialSource(basic_files(volume))
    first = source.load()
    assert not source.check() and source.load() is first
    volume.update({"password": NEW_PASSWORD.encode()})
    assert source.check()
    basic = source.load().basic
    assert basic is not None and (basic.user, basic.password) == ("sr", NEW_PASSWORD)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert str(volume.path("password")) in text and "reloaded" in text
    assert PASSWORD not in text and NEW_PASSWORD not in text


def test_a_half_written_password_keeps_the_last_good_pair(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An in-place rewrite caught half-way (the file truncated, not yet written) keeps the old pair
    with one warning naming the file; the complete file is then used."""
    user, password = tmp_path / "username", tmp_path / "password"
    user.write_text("sr")
    password.write_text(PASSWORD)
    source = MaterialSource(MaterialFiles(username=str(user), password=str(password)))
    source.load()
    password.write_text("")
    assert not source.check()
    basic = source.load().basic
    assert basic is not None and basic.password == PASSWORD
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and str(password) in warned[0] and "keeping the material loaded before" in warned[0]
    password.write_text(NEW_PASSWORD + "\n")
    assert source.check()
    basic = source.load().basic
    assert basic is not None and basic.password == NEW_PASSWORD
    assert all(PASSWORD not in r.getMessage() and NEW_PASSWORD not in r.getMessage() for r in caplog.records)


def test_a_missing_file_at_start_is_an_error_naming_it(tmp_path: Path) -> None:
    source = MaterialSource(MaterialFiles(username=str(tmp_path / "username"), password=str(tmp_path / "nope")))
    with pytest.raises(MaterialError) as err:
        source.load()
    assert str(tmp_path) in err.value.where and "cannot be read" in err.value.reason
