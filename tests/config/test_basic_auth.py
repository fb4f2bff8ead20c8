"""User and password from files (`<side>_user_file` / `<side>_password_file`, `heartbeats.user_file` /
`password_file`): the pair goes together, it is one way to authenticate among the others (a URL's
`user:password@` and `token@` included), and unreadable files stop the process at start with exit
status 2 naming the key; no message ever shows a password."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from replicator.cli.main import main
from replicator.config import ConfigError, Profile, parse_config
from replicator.heartbeats.publisher import heartbeat_profile
from replicator.transport.connections import material_files

BASE = {"topic": "acme.cmdb", "source_url": "nats://a:4222", "target_url": "nats://b:4222"}
SECRET = "pw-9xQ2-never-shown"
HEARTBEATS = {"url": "nats://hb:4222", "subjects": [{"subject": "hb.site"}]}


def _files(side: str = "source") -> dict[str, str]:
    return {f"{side}_user_file": "/run/sr/username", f"{side}_password_file": "/run/sr/password"}


# (topic overrides, the key the message names, text in the message)
REFUSED: list[tuple[dict[str, Any], str, str]] = [
    ({"source_user_file": "/u"}, "topics.cmdb",
     "source_user_file and source_password_file go together (a user name and its password)"),
    ({"target_password_file": "/p"}, "topics.cmdb", "target_user_file and target_password_file go together"),
    ({**_files(), "source_credentials": "/c.creds"}, "topics.cmdb",
     "one way to authenticate the source at a time, not ['source_credentials', 'source_user_file']"),
    ({**_files(), "source_jwt_file": "/u.jwt", "source_seed_file": "/u.nk"}, "topics.cmdb",
     "not ['source_jwt_file', 'source_user_file']"),
    ({**_files(), "source_url": f"nats://sr:{SECRET}@a:4222"}, "topics.cmdb",
     "not ['source_user_file', 'source_url user:password@']"),
    ({**_files("target"), "target_url": f"nats://{SECRET}@b:4222"}, "topics.cmdb",
     "not ['target_user_file', 'target_url token@']"),
    ({**_files("target"), "target_url": "nats://b:4222?credentials=/c.creds"}, "topics.cmdb",
     "not ['target_user_file', 'target_url ?credentials=']"),
    ({"source_credentials": "/c.creds", "source_url": f"nats://sr:{SECRET}@a:4222"}, "topics.cmdb",
     "not ['source_credentials', 'source_url user:password@']"),
]


@pytest.mark.parametrize(("override", "key", "text"), REFUSED, ids=[r[2][:60] for r in REFUSED])
def test_refused_combinations_name_the_keys(override: dict[str, Any], key: str, text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"topics": {"cmdb": {**BASE, **override}}}, "sr.yaml")
    message = str(err.value)
    assert message.startswith(f"sr.yaml: {key}: ") and text in message, message
    assert SECRET not in message


@pytest.mark.parametrize(("override", "text"), [
    ({"user_file": "/u"}, "heartbeats: user_file and password_file go together"),
    ({"user_file": "/u", "password_file": "/p", "credentials": "/c.creds"},
     "one way to authenticate the heartbeat connection at a time, not ['credentials', 'user_file']"),
    ({"user_file": "/u", "password_file": "/p", "url": f"nats://hb:{SECRET}@hb:4222"},
     "not ['user_file', 'url user:password@']"),
])
def test_heartbeats_follow_the_same_rules(override: dict[str, Any], text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"heartbeats": {**HEARTBEATS, **override}, "topics": {}}, "sr.yaml")
    assert text in str(err.value) and SECRET not in str(err.value), err.value


def test_the_files_are_one_way_to_authenticate_and_reach_the_connection() -> None:
    """Each side on its own: files on the source, a `.creds` file on the target; the connection
    reads both files (never their content at load)."""
    topic = {**BASE, **_files(), "target_credentials": "/run/sr/target.creds"}
    profile = Profile(parse_config({"topics": {"cmdb": topic}}, "sr.yaml"), "cmdb")
    assert profile.basic_auth_for("source") == ("/run/sr/username", "/run/sr/password")
    assert profile.basic_auth_for("target") is None
    files = material_files(profile, "source")
    assert (files.username, files.password, files.creds) == ("/run/sr/username", "/run/sr/password", None)
    assert material_files(profile, "target").creds == "/run/sr/target.creds"
    config = parse_config({"heartbeats": {**HEARTBEATS, "user_file": "/u", "password_file": "/p"}, "topics": {}})
    hb = heartbeat_profile(config, "SITE")
    assert hb.basic_auth_for("source") == ("/u", "/p")


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("side", "label"), [("source", "user_file"), ("target", "password_file")])
def test_unreadable_files_exit_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str], side: str,
                                                label: str) -> None:
    readable = tmp_path / "readable"
    readable.write_text("sr\n")
    missing = tmp_path / "nope"
    files = {f"{side}_user_file": str(readable), f"{side}_password_file": str(readable),
             f"{side}_{label}": str(missing)}
    path = tmp_path / "sr.yaml"
    path.write_text(yaml.safe_dump({"topics": {"cmdb": {**BASE, **files}}}))
    assert main(["--config", str(path), "--topic", "cmdb"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: topics.cmdb.{side}_{label}: file {missing} is not readable" in err, err
    assert "Traceback" not in err


@pytest.mark.timeout(20)
def test_unreadable_heartbeat_password_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    readable = tmp_path / "user"
    readable.write_text("hb")
    path = tmp_path / "sr.yaml"
    heartbeats = {**HEARTBEATS, "user_file": str(readable), "password_file": str(tmp_path / "nope")}
    path.write_text(yaml.safe_dump({"heartbeats": heartbeats, "topics": {}}))
    assert main(["replicate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: heartbeats.password_file: file {tmp_path / 'nope'} is not readable" in err, err


def test_the_console_script_exits_2(tmp_path: Path) -> None:
    """The real process: exit status 2, one line naming the key, no traceback."""
    path = tmp_path / "sr.yaml"
    path.write_text(yaml.safe_dump({"topics": {"cmdb": {**BASE, "source_user_file": str(tmp_path / "u"),
                                                        "source_password_file": str(tmp_path / "p")}}}))
    done = subprocess.run([sys.executable, "-m", "replicator", "--config", str(path), "--topic", "cmdb"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == f"stream-replicator: config error: {path}: topics.cmdb.source_user_file: " \
                                  f"file {tmp_path / 'u'} is not readable"
