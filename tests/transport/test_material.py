"""Material from files: what counts as a change, what parses, and what is kept when it does not.

No servers here: `tests/security/test_rotation.py` proves the reconnects against real ones.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

import pytest

from replicator.transport.material import MaterialError, MaterialFiles, MaterialSource, build
from tests.support.certs import CertificateAuthority, bundle, cert_pem, key_pem
from tests.support.nats_jwt import Decentralised
from tests.support.secret_volume import SecretVolume

CA = CertificateAuthority.create("material-ca")
OTHER = CertificateAuthority.create("material-other", days=90)


@pytest.fixture
def volume(tmp_path: Path) -> SecretVolume:
    leaf = CA.issue("sr", client=True)
    return SecretVolume(tmp_path / "tls", {"ca.crt": CA.pem, "tls.crt": cert_pem(leaf.cert),
                                            "tls.key": key_pem(leaf.key)})


def tls_files(volume: SecretVolume) -> MaterialFiles:
    return MaterialFiles(tls=True, ca=str(volume.path("ca.crt")), cert=str(volume.path("tls.crt")),
                         key=str(volume.path("tls.key")))


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_kubelet_data_swap_is_a_change(volume: SecretVolume) -> None:
    source = MaterialSource(tls_files(volume))
    first = source.load()
    renewed = CA.issue("sr", client=True, days=20)
    volume.update({"tls.crt": cert_pem(renewed.cert), "tls.key": key_pem(renewed.key)})
    assert source.check()
    assert source.load() is not first
    assert source.load().not_after("client") == renewed.cert.not_valid_after_utc.timestamp()


def test_in_place_rewrite_is_a_change_and_a_touch_is_not(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(CA.pem)
    source = MaterialSource(MaterialFiles(tls=True, ca=str(ca)))
    first = source.load()
    os.utime(ca, ns=(1, 1))  # same content, other mtime
    assert not source.check() and source.load() is first
    with open(ca, "r+b") as fh:  # same inode, new content
        fh.write(bundle(CA, OTHER))
    assert source.check()
    assert {c.subject for c in source.load().certificates} == {"CN=material-ca,O=stream-replicator tests",
                                                                "CN=material-other,O=stream-replicator tests"}
    assert source.load().not_after("ca") == CA.cert.not_valid_after_utc.timestamp()  # the first to expire


@pytest.mark.parametrize("damage", ["half-written certificate", "key of another certificate", "missing file",
                                    "half-written CA bundle"])
def test_a_bad_change_keeps_the_last_good_material_and_warns_once(
        volume: SecretVolume, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    source = MaterialSource(tls_files(volume))
    good = source.load()
    renewed = CA.issue("sr", client=True, days=20)
    cert, key = cert_pem(renewed.cert), key_pem(renewed.key)
    named = volume.path("tls.crt")
    if damage == "half-written certificate":
        volume.update({"tls.crt": cert[: len(cert) // 2], "tls.key": key})
    elif damage == "key of another certificate":
        volume.update({"tls.crt": cert})
        named = volume.path("tls.key")
    elif damage == "missing file":
        os.unlink(volume.path("tls.key"))
        named = volume.path("tls.key")
    else:
        volume.update({"ca.crt": CA.pem[:100]})
        named = volume.path("ca.crt")
    for _ in range(3):  # every reconnect asks again: still one warning
        assert not source.check()
        assert source.load() is good
    (message,) = warnings(caplog)
    assert str(named) in message and "keeping the material loaded before" in message
    assert "BEGIN" not in caplog.text and key.decode().splitlines()[1] not in caplog.text
    if damage == "missing file":
        volume.update({"tls.crt": cert, "tls.key": key})
    else:
        volume.update({"ca.crt": CA.pem, "tls.crt": cert, "tls.key": key})
    assert source.check()  # retried when the files change again
    assert source.load().not_after("client") == renewed.cert.not_valid_after_utc.timestamp()


def test_creds_rotation_and_a_half_written_creds_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    auth = Decentralised.create()
    creds = auth.write_creds(tmp_path / "user.creds")
    source = MaterialSource(MaterialFiles(creds=str(creds)))
    first = source.load().user
    assert first is not None and first.public_key == auth.user.public
    auth.rotate_user()
    text = auth.creds_text()
    creds.write_text(text[: len(text) // 2])
    assert not source.check() and source.load().user is first
    assert [m for m in warnings(caplog) if str(creds) in m]
    assert auth.user.seed.decode() not in caplog.text
    creds.write_text(text)
    assert source.check()
    user = source.load().user
    assert user is not None and user.public_key == auth.user.public
    assert bytes(source.user_jwt()) == text.splitlines()[1].encode()
    assert len(source.sign("nonce")) > 40


def test_jwt_and_seed_files_and_a_bare_nkey(tmp_path: Path) -> None:
    """The pieces of a `.creds` file as two files, and nkey authentication with a seed alone."""
    auth = Decentralised.create()
    jwt, seed = tmp_path / "user.jwt", tmp_path / "user.nk"
    jwt.write_text(auth.user_jwt() + "\n")
    seed.write_bytes(auth.user.seed + b"\n")
    user = MaterialSource(MaterialFiles(jwt=str(jwt), seed=str(seed))).load().user
    assert user is not None and user.jwt is not None and user.public_key == auth.user.public
    bare = MaterialSource(MaterialFiles(seed=str(seed))).load().user
    assert bare is not None and bare.jwt is None and bare.public_key.startswith("U")
    other = Decentralised.create()
    seed.write_bytes(other.user.seed)
    with pytest.raises(MaterialError, match="belongs to another nkey"):
        MaterialSource(MaterialFiles(jwt=str(jwt), seed=str(seed))).load()
    # The Go client's UserCredentials(jwt, seed) also takes armoured files: a `.creds` file as either.
    creds = str(auth.write_creds(tmp_path / "user.creds"))
    armoured = MaterialSource(MaterialFiles(jwt=creds, seed=creds)).load().user
    assert armoured is not None and armoured.jwt == auth.user_jwt().encode() and armoured.public_key == auth.user.public


def test_tls_without_files_is_material_too() -> None:
    """`?insecure=true` alone: TLS on, the system's CAs, no verification, nothing to read."""
    material = MaterialSource(MaterialFiles(tls=True, insecure=True)).load()
    assert material.ssl_context is not None and material.ssl_context.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(("data", "where", "reason"), [
    ({"ca": b"junk"}, "ca", "not a PEM certificate"),
    ({"cert": cert_pem(CA.cert), "key": b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"},
     "key", "not an unencrypted PEM private key"),
    ({"creds": b"-----BEGIN NATS USER JWT-----\n"}, "creds", "not a credentials file"),
    ({"seed": b"SUAAAA"}, "seed", "not an nkey seed"),
])
def test_first_load_errors_name_the_file(data: dict[str, bytes], where: str, reason: str) -> None:
    files = MaterialFiles(tls=any(k in data for k in ("ca", "cert", "key")),
                          **{k: f"/etc/sr/{k}" for k in data})  # type: ignore[arg-type]
    with pytest.raises(MaterialError) as err:
        build(files, data)
    assert err.value.where == f"/etc/sr/{where}" and reason in err.value.reason
