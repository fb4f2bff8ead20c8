"""The Go Stream Replicator's config format: every key of its schema loads and maps onto the model;
broken files exit 2 naming the key and the file, as legacy files do."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from replicator.cli.main import main
from replicator.config import ConfigError, Profile, load_config, parse_config
from replicator.config.durations import parse_go_duration
from replicator.config.goformat import GoConfig, GoStream, is_go_format
from replicator.config.urls import url_options
from replicator.heartbeats.publisher import heartbeat_profile
from replicator.transport.connections import connect_options

# Every key of the Go tool's schema (research table), with non-default values.
EVERY_KEY: dict[str, Any] = {
    "name": "US-EAST",
    "state_store": "/var/lib/sr",
    "tls": {"ca": "/etc/sr/ca.pem", "cert": "/etc/sr/cert.pem", "key": "/etc/sr/key.pem"},
    "choria": {"seed_file": "/etc/sr/choria.seed", "jwt_file": "/etc/sr/choria.jwt", "collective": "choria"},
    "monitor_port": 9100,
    "profiling": True,
    "logfile": "/var/log/sr.log",
    "loglevel": "warn",
    "heartbeats": {
        "url": "nats://src:4222?credentials=/etc/sr/hb.creds",
        "interval": "15s",
        "leader_election": True,
        "headers": {"from": "us-east"},
        "tls": {"ca": "/etc/sr/hb-ca.pem"},
        "choria": {"seed_file": "/etc/sr/hb.seed", "jwt_file": "/etc/sr/hb.jwt", "collective": "choria"},
        "subjects": [{"subject": "fleet._monitor"}, {"subject": "other._monitor", "interval": "1m",
                                                      "headers": {"noop": "true"}}],
    },
    "streams": [
        {
            "name": "PARTITION1",
            "stream": "NODE_DATA",
            "target_stream": "FLEET_NODES",
            "filter_subject": "fleet.eu.>",
            "target_subject_prefix": "FLEET_NODES",
            "target_subject_remove": "NODE_DATA",
            "source_url": "nats://src1:4222,nats://src2:4222?connect_timeout=1500ms&tls_handshake_first=true",
            "target_url": "nats://dst:4222?jwt=/etc/sr/t.jwt&nkey=/etc/sr/t.nk&insecure=true",
            "no_target_create": True,
            "start_time": "2024-01-02T03:04:05Z",
            "source_tls": {"ca": "/etc/sr/src-ca.pem"},
            "target_tls": {"ca": "/etc/sr/dst-ca.pem", "cert": "/etc/sr/dst.pem", "key": "/etc/sr/dst-key.pem"},
            "source_choria": {"seed_file": "/etc/sr/s.seed", "jwt_file": "/etc/sr/s.jwt"},
            "max_age": "1d",
            "inspect_field": "facts.host",
            "inspect_force_field": "force_copy",
            "inspect_duration": "1h",
            "warn_duration": "12m",
            "size_trigger": 1024.5,
            "leader_election_name": "us-east-1",
            "advisory": {"subject": "NODE_DATA_ADVISORIES.%s.%v", "reliable": True},
        },
        {
            "stream": "KV_CONFIG",
            "filter_subject": "$KV.CONFIG.>",
            "source_url": "nats://src:4222",
            "target_url": "nats://dst:4222?credentials=/etc/sr/dst.creds",
            "ephemeral": True,
            "start_at_end": False,
            "start_sequence": 10,
            "tls": {},
            "choria": {},
            "target_choria": {"seed_file": "/etc/sr/x.seed", "jwt_file": "/etc/sr/x.jwt"},
        },
        {"stream": "HEADERS", "name": "H", "source_url": "nats://s:1", "target_url": "nats://t:2",
         "inspect_header": "Sender", "inspect_duration": "30m", "start_delta": "1w", "target_initiated": False},
        {"stream": "SUBJECTS", "name": "S", "source_url": "nats://s:1", "target_url": "nats://t:2",
         "inspect_subject_token": -1, "inspect_duration": "2h", "start_at_end": True, "ephemeral": False},
        {"stream": "PUSH", "name": "P", "source_url": "nats://s:1", "target_url": "nats://t:2",
         "target_initiated": True, "filter_subject": "push.>"},
    ],
}


def test_every_key_of_the_go_schema_loads_and_maps_onto_the_model(tmp_path: Path) -> None:
    keys = set(EVERY_KEY) | {k for s in EVERY_KEY["streams"] for k in s}
    assert keys >= set(GoConfig.model_fields) | set(GoStream.model_fields)
    path = tmp_path / "sr.yaml"
    path.write_text(yaml.safe_dump(EVERY_KEY))
    config = load_config(path)
    assert config.dialect == "go" and config.name == "US-EAST"
    assert sorted(config.topics) == ["HEADERS_H", "KV_CONFIG_US-EAST", "NODE_DATA_PARTITION1", "PUSH_P",
                                     "SUBJECTS_S"]
    assert (config.state_dir, config.logfile, config.log_format, config.log_level) == (
        "/var/lib/sr", "/var/log/sr.log", "json", "warn")

    first = Profile(config, "NODE_DATA_PARTITION1")
    s = first.settings
    assert (first.durable_name, first.base_name, s.topic, s.source_stream, s.target_stream) == (
        "SR_PARTITION1", "SR_PARTITION1_NODE_DATA", "fleet.eu.>", "NODE_DATA", "FLEET_NODES")
    assert (s.target_subject_prefix, s.target_subject_remove, s.target_create, s.monitor) == (
        "FLEET_NODES", "NODE_DATA", False, 9100)
    assert s.start_time == dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC) and s.max_age == 86400
    assert (s.inspect, s.update_flag, s.age, s.size_trigger, s.limiter_state) == (
        "facts.host", "force_copy", 3600, 1025, "kv")
    assert s.advisory is not None and (s.advisory.target, s.advisory.cluster, s.advisory.age, s.advisory.format,
                                       s.advisory.reliable) == ("NODE_DATA_ADVISORIES.%s.%v", "source", 720,
                                                                "v2", True)
    assert s.leader_election and s.leader_election_bucket == "CHORIA_LEADER_ELECTION"
    assert first.go is not None and (first.go.replicator, first.go.name, first.go.election_name) == (
        "US-EAST", "PARTITION1", "us-east-1")
    # TLS: the most specific block wins; URL options add to it.
    src, dst = first.tls_for("source"), first.tls_for("target")
    assert src is not None and src.ca == "/etc/sr/src-ca.pem" and src.handshake_first and not src.insecure
    assert dst is not None and dst.cert == "/etc/sr/dst.pem" and dst.insecure
    assert first.jwt_for("source") == ("/etc/sr/s.jwt", "/etc/sr/s.seed")
    assert first.jwt_for("target") == ("/etc/sr/t.jwt", "/etc/sr/t.nk")  # the URL's wins over `choria`
    assert first.connect_timeout_for("source") == 1.5 and first.connect_timeout_for("target") is None

    kv = Profile(config, "KV_CONFIG_US-EAST")
    assert kv.durable_name == "SR_US-EAST" and kv.settings.ephemeral and kv.settings.start_sequence == 10
    assert kv.tls_for("source") is None and kv.jwt_for("source") is None  # `tls: {}`, `choria: {}` override
    assert kv.credentials_for("target") == "/etc/sr/dst.creds" and kv.jwt_for("target") is None
    assert not kv.settings.inspect and kv.settings.limiter_state == "memory"

    headers = Profile(config, "HEADERS_H").settings
    assert (headers.inspect_header, headers.age, headers.limiter_state, headers.start_delta) == (
        "Sender", 1800, "file", 7 * 86400)
    subjects = Profile(config, "SUBJECTS_S").settings
    assert subjects.inspect_subject_token == -1 and subjects.start_at_end
    assert Profile(config, "PUSH_P").settings.topic == "push.>"

    hb = config.heartbeats
    assert hb is not None and (hb.interval, hb.leader_election, hb.leader_election_bucket) == (
        15, True, "CHORIA_LEADER_ELECTION")
    assert [(x.subject, x.interval, x.headers) for x in hb.subjects] == [
        ("fleet._monitor", None, {}), ("other._monitor", 60, {"noop": "true"})]
    # The URL's `?credentials=` wins over `choria`, as for a stream (both would be two ways to sign in).
    assert (hb.credentials, hb.jwt_file, hb.seed_file, hb.tls and hb.tls.ca) == (
        None, None, None, "/etc/sr/hb-ca.pem")
    assert heartbeat_profile(config, "US-EAST").credentials_for("source") == "/etc/sr/hb.creds"
    assert any("profiling" in w for w in config.warnings)
    assert any("target_initiated" in w for w in config.warnings)


def test_connection_options_come_from_the_url_query() -> None:
    url = "nats://src1:4222,nats://src2:4222?connect_timeout=1500ms&tls_handshake_first=true&insecure=true"
    config = parse_config({"name": "SITE", "streams": [{**GOOD_STREAM, "source_url": url}]}, "sr.yaml")
    opts = connect_options(Profile(config, "S_SITE"), "source", "w")
    assert opts["servers"] == ["tls://src1:4222", "tls://src2:4222"]  # no query strings left
    assert opts["connect_timeout"] == 1.5 and opts["tls_handshake_first"] is True
    assert opts["tls"].verify_mode.name == "CERT_NONE"
    assert url_options("nats://a:1?credentials=/x.creds,nats://b:2").servers == ("nats://a:1", "nats://b:2")


@pytest.mark.parametrize(("text", "seconds"), [
    ("10s", 10), ("1h30m", 5400), ("500ms", 0.5), ("1.5h", 5400), ("2d", 172800), ("1w", 604800),
    ("1M", 30 * 86400), ("1Y", 365 * 86400), ("3H", 10800), ("", 0),
])
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


def test_format_detection_and_legacy_files_unchanged() -> None:
    assert is_go_format({"name": "x", "streams": []})
    assert not is_go_format({"topics": {}})
    assert is_go_format({"name": "x", "monitor_port": 1, "heartbeats": {}})
    legacy = parse_config({"topics": {"t": {"topic": "a.b", "source_url": "nats://a:1", "target_url": "nats://b:1"}}})
    assert legacy.dialect == "legacy" and not legacy.warnings


GOOD_STREAM = {"stream": "S", "source_url": "nats://a:4222", "target_url": "nats://b:4222"}
SAMPLED = {"inspect_field": "host", "inspect_duration": "1h"}

# (stream overrides, top-level overrides, key in the message, text in the message)
BROKEN: list[tuple[dict[str, Any], dict[str, Any], str, str]] = [
    ({}, {"name": None}, "name", "required key is missing"),
    ({"stream": None}, {}, "streams.0.stream", "required key is missing"),
    ({"source_url": None}, {}, "streams.0.source_url", "required key is missing"),
    ({"inspect_duraton": "1h"}, {}, "streams.0.inspect_duraton", "unknown key"),
    ({}, {"monitor": 8080}, "monitor", "unknown key"),
    ({"inspect_duration": "5 minutes", "inspect_field": "host"}, {}, "streams.0.inspect_duration",
     "invalid duration"),
    ({"max_age": "10"}, {}, "streams.0.max_age", "invalid time unit"),
    ({"inspect_field": "host", "inspect_header": "X", "inspect_duration": "1h"}, {}, "streams.0",
     "only one inspection mode"),
    ({"inspect_force_field": "force"}, {}, "streams.0", "inspect_force_field needs inspect_field"),
    ({"target_initiated": True}, {}, "streams.0", "filter_subject is required with target_initiated"),
    ({"target_initiated": True, "filter_subject": "a.>", **SAMPLED}, {}, "streams.0",
     "cannot be used with target_initiated"),
    ({"inspect_field": "hosts.#.name", "inspect_duration": "1h"}, {}, "streams.0.inspect_field",
     "only dotted paths"),
    ({"inspect_subject_token": -2, "inspect_duration": "1h"}, {}, "streams.0.inspect_subject_token", "-1"),
    ({"source_url": "nats://a:4222?jwt=/u.jwt"}, {}, "streams.0.source_url", "jwt and nkey go together"),
    ({"source_url": "nats://a:4222?credentail=/u.creds"}, {}, "streams.0.source_url", "unknown URL option"),
    ({"target_url": "nats://b:4222?insecure=maybe"}, {}, "streams.0.target_url", "not true or false"),
    ({"target_url": "http://b:80"}, {}, "streams.0.target_url", "invalid NATS URL"),
    ({"name": "has.dot"}, {}, "streams.0.name", "cannot be part of a consumer name"),
    ({}, {"name": "US EAST"}, "name", "cannot be part of a consumer name"),
    ({"advisory": {"subject": "adv.>"}, **SAMPLED}, {}, "streams.0.advisory.subject", "literal subject"),
    ({"choria": {"jwt_file": "/x.jwt"}}, {}, "streams.0.choria", "go together"),
    ({"tls": {"cert": "/c.pem"}}, {}, "streams.0.tls", "cert and key go together"),
    ({}, {"heartbeats": {"url": "nats://a:1", "subjects": []}}, "heartbeats.subjects", "at least 1 item"),
    ({}, {"heartbeats": {"subjects": [{"subject": "a"}]}}, "heartbeats.url", "required key is missing"),
    ({}, {"heartbeats": {"url": "nats://a:1", "subjects": [{"interval": "1s"}]}}, "heartbeats.subjects.0.subject",
     "required key is missing"),
    ({}, {"loglevel": "trace"}, "loglevel", "'debug', 'info'"),
]


def _file(stream: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = {k: v for k, v in {**GOOD_STREAM, **stream}.items() if v is not None}
    return {k: v for k, v in {"name": "SITE", "streams": [merged], **top}.items() if v is not None}


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("stream", "top", "key", "text"), BROKEN, ids=[f"{b[2]}:{b[3]}" for b in BROKEN])
def test_broken_go_file_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               stream: dict[str, Any], top: dict[str, Any], key: str,
                                               text: str) -> None:
    path = tmp_path / "sr.yaml"
    path.write_text(yaml.safe_dump(_file(stream, top)))
    code = main(["replicate", "--config", str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{path}: {key}" in err and text in err, err
    assert "Traceback" not in err


def test_duplicate_stream_names_and_unreadable_files_exit_2(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sr.yaml"
    path.write_text(yaml.safe_dump({"name": "SITE", "streams": [GOOD_STREAM, GOOD_STREAM]}))
    assert main(["replicate", "--config", str(path)]) == 2
    assert "duplicate stream configuration name SITE for stream S" in capsys.readouterr().err
    missing = tmp_path / "nope.seed"
    for stream, key in (({"choria": {"jwt_file": str(path), "seed_file": str(missing)}}, "streams.0.choria.seed_file"),
                        ({"target_url": f"nats://b:4222?credentials={missing}"}, "streams.0.target_url")):
        path.write_text(yaml.safe_dump(_file(stream, {})))
        assert main(["replicate", "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"{path}: {key}: file {missing} is not readable" in err, err


def test_warnings_for_keys_that_cannot_apply() -> None:
    config = parse_config(_file({"start_at_end": True, "start_sequence": 5, "inspect_field": "host",
                                 "advisory": {"subject": "adv"}}, {"profiling": True}), "sr.yaml")
    text = "\n".join(config.warnings)
    assert "profiling: accepted and ignored" in text
    assert "start_at_end is used" in text
    assert "inspect_field without inspect_duration: sampling is off" in text
    assert "advisory without sampling" in text
    settings = next(iter(config.topics.values()))
    assert settings.start_at_end and not settings.start_sequence and not settings.sampling
    with pytest.raises(ConfigError, match="at least one stream"):
        parse_config({"name": "SITE", "streams": []}, "sr.yaml")
    legacy = {"topic": "a.b", "source_url": "nats://a:1", "target_url": "nats://b:1", "workers": 2}
    with pytest.raises(ConfigError, match=r"topics\.t: ephemeral is for ordered mode"):
        parse_config({"topics": {"t": {**legacy, "ephemeral": True}}}, "sr.yaml")


def test_credentials_in_a_url_win_over_choria() -> None:
    """A user:password, token or `?credentials=` in a URL replaces the `choria` JWT and seed that
    would otherwise apply there (the Go client would send both; one way to sign in is kept), for a
    stream's side and for the heartbeats alike. The Go tool has no user or password file keys."""
    choria = {"jwt_file": "/etc/sr/u.jwt", "seed_file": "/etc/sr/u.seed"}
    stream = {**GOOD_STREAM, "target_url": "nats://sr:pw@b:4222"}
    heartbeats = {"url": "nats://hb:4222", "subjects": [{"subject": "hb.x"}], "choria": choria}
    config = parse_config({"name": "SITE", "choria": choria, "streams": [stream], "heartbeats": heartbeats},
                          "sr.yaml")
    profile = Profile(config, "S_SITE")
    assert profile.jwt_for("source") == ("/etc/sr/u.jwt", "/etc/sr/u.seed")
    assert profile.jwt_for("target") is None and profile.url_options("target").userinfo == "user:password"
    assert config.heartbeats is not None and config.heartbeats.jwt_file == "/etc/sr/u.jwt"
    with_token = {**heartbeats, "url": "nats://s3cr3t@hb:4222"}
    config = parse_config({"name": "SITE", "streams": [GOOD_STREAM], "heartbeats": with_token}, "sr.yaml")
    assert config.heartbeats is not None and config.heartbeats.jwt_file is None
    assert not {"user_file", "password_file"} & (set(GoStream.model_fields) | set(GoConfig.model_fields))
