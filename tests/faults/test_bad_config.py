"""Bad configs: every one exits 2 with a message naming the file and the key, never a traceback.

`tests/config/test_config.py` has the first table (bad ages, workers, URLs, names...); this one
adds wrong types, unknown keys at every level, more bad durations, conflicting sampling keys,
missing keys and unusable TLS material, all through the real CLI entry point. A property test
then throws generated configs at `parse_config` (random nested values, and the real keys with
random-typed values): it must return or raise `ConfigError`, nothing else.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicator.cli.main import main
from replicator.config import AdvisoryConfig, Config, ConfigError, TLSConfig, TopicConfig, parse_config

BASE = {"topic": "acme.cmdb", "source_url": "nats://127.0.0.1:4222", "target_url": "nats://127.0.0.1:4223"}
SAMPLED = {"inspect": "host", "age": "1h"}

# (topic overrides, global overrides, key named in the message, text in the message)
BROKEN: list[tuple[dict[str, Any], dict[str, Any], str, str]] = [
    # wrong types
    ({"workers": 1.5}, {}, "topics.cmdb.workers", "integer"),
    ({"batch": "lots"}, {}, "topics.cmdb.batch", "integer"),
    ({"max_in_flight": [1]}, {}, "topics.cmdb.max_in_flight", "integer"),
    ({"target_create": "perhaps"}, {}, "topics.cmdb.target_create", "boolean"),
    ({"leader_election": {"on": True}}, {}, "topics.cmdb.leader_election", "boolean"),
    ({"topic": 42}, {}, "topics.cmdb.topic", "string"),
    ({"source_url": ["nats://a:4222"]}, {}, "topics.cmdb.source_url", "string"),
    ({"advisory": "fleet.advisories", **SAMPLED}, {}, "topics.cmdb.advisory", "dictionary"),
    ({"tls": "yes"}, {}, "topics.cmdb.tls", "dictionary"),
    ({"start_time": "yesterday"}, {}, "topics.cmdb.start_time", "datetime"),
    ({"inspect_subject_token": 0, "age": "1h"}, {}, "topics.cmdb.inspect_subject_token", "greater than"),
    ({}, {"debug": "very"}, "debug", "boolean"),
    ({}, {"log_format": "xml"}, "log_format", "'text' or 'json'"),
    ({}, {"topics": ["cmdb"]}, "topics", "dictionary"),
    ({}, {"tls": {"scheme": "kerberos"}}, "tls.scheme", "'puppet' or 'manual'"),
    # unknown keys, at every level
    ({}, {"colour": "blue"}, "colour", "unknown key"),
    ({"tls": {"ca": "/x/ca.pem", "passphrase": "p"}}, {}, "topics.cmdb.tls.passphrase", "unknown key"),
    ({"advisory": {"target": "adv.x", "subject": "y"}, **SAMPLED}, {}, "topics.cmdb.advisory.subject",
     "unknown key"),
    ({"sourceUrl": "nats://a:1"}, {}, "topics.cmdb.sourceUrl", "unknown key"),
    # bad durations
    ({"start_delta": "tomorrow"}, {}, "topics.cmdb.start_delta", "invalid duration"),
    ({"leader_election_ttl": "1y"}, {}, "topics.cmdb.leader_election_ttl", "invalid duration"),
    ({"advisory": {"target": "adv.x", "age": "soon"}, **SAMPLED}, {}, "topics.cmdb.advisory.age",
     "invalid duration"),
    ({"age": "-5m", "inspect": "host"}, {}, "topics.cmdb.age", "invalid duration"),
    ({"max_age": True}, {}, "topics.cmdb.max_age", "invalid duration"),
    ({"age": "5 minutes", "inspect": "host"}, {}, "topics.cmdb.age", "invalid duration"),
    # conflicting sampling keys (inspect + inspect_header is in test_config.py)
    ({"inspect": "host", "inspect_subject_token": 2, "age": "1h"}, {}, "topics.cmdb", "only one of inspect"),
    ({"inspect_header": "X-Host", "inspect_subject_token": 2, "age": "1h"}, {}, "topics.cmdb",
     "only one of inspect"),
    ({"update_flag": "force"}, {}, "topics.cmdb", "need a sampling key"),
    ({"limiter_state": "kv"}, {}, "topics.cmdb", "limiter_state 'kv' needs a sampling key"),
    ({"limiter_state": "file", **SAMPLED}, {}, "topics.cmdb.limiter_state", "needs state_dir"),
    # missing keys and URLs
    ({"source_url": None}, {}, "topics.cmdb.source_url", "required key is missing"),
    ({"topic": None}, {}, "topics.cmdb.topic", "required key is missing"),
    ({"source_url": " , "}, {}, "topics.cmdb.source_url", "at least one NATS URL"),
    ({"target_url": "nats://two words:4222"}, {}, "topics.cmdb.target_url", "invalid NATS URL"),
    ({"source_url": "nats://a:4222,http://b:80"}, {}, "topics.cmdb.source_url", "invalid NATS URL"),
]


def _config(topic: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = {k: v for k, v in {**BASE, **topic}.items() if v is not None}
    return {"topics": {"cmdb": merged}, **top}


def _cli(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The CLI in-process (same code path as the console script, 50x faster than a process)."""
    code = main(["--config", str(path), "--topic", "cmdb"])
    return code, capsys.readouterr().err


@pytest.mark.timeout(20)  # a config that wrongly passes would start replicating: fail fast, not hang
@pytest.mark.parametrize(("topic", "top", "key", "text"), BROKEN, ids=[f"{b[2]}:{b[3]}" for b in BROKEN])
def test_broken_config_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              topic: dict[str, Any], top: dict[str, Any], key: str,
                                              text: str) -> None:
    path = tmp_path / "sr.yaml"
    path.write_text(yaml.safe_dump(_config(topic, top)))
    code, err = _cli(path, capsys)
    assert code == 2, err
    assert f"{path}: {key}" in err, err
    assert text in err, err
    assert "Traceback" not in err


TLS_FILES = [
    ({"tls": {"scheme": "puppet", "ssl_dir": "{tmp}/ssl", "identity": "sr1"}}, {},
     "topics.cmdb.tls: source TLS ca file {tmp}/ssl/certs/ca.pem is not readable"),
    ({}, {"tls": {"cert": "{tmp}/missing-cert.pem", "key": "{tmp}/key.pem"}},
     "tls: source TLS cert file {tmp}/missing-cert.pem is not readable"),
    ({"target_tls": {"ca": "{tmp}/nope/ca.pem"}}, {},
     "topics.cmdb.target_tls: target TLS ca file {tmp}/nope/ca.pem is not readable"),
    ({"source_credentials": "{tmp}/sr.creds"}, {},
     "topics.cmdb.source_credentials: file {tmp}/sr.creds is not readable"),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("topic", "top", "message"), TLS_FILES,
                         ids=["puppet", "global-manual", "target_tls", "creds"])
def test_unreadable_tls_and_credentials_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     topic: dict[str, Any], top: dict[str, Any],
                                                     message: str) -> None:
    """Checked at start for the profile being run, so a typo fails now, not at the first reconnect."""
    (tmp_path / "key.pem").write_text("not checked: the cert is missing first")
    text = yaml.safe_dump(_config(topic, top)).replace("{tmp}", str(tmp_path))
    path = tmp_path / "sr.yaml"
    path.write_text(text)
    code, err = _cli(path, capsys)
    assert code == 2, err
    assert f"{path}: " + message.replace("{tmp}", str(tmp_path)) in err


@pytest.mark.timeout(20)
def test_config_file_that_is_not_utf8_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sr.yaml"
    path.write_bytes(b"\xff\xfetopics: {}\n")
    code, err = _cli(path, capsys)
    assert code == 2 and str(path) in err


def test_huge_integer_duration_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"topics.cmdb.max_age: invalid duration"):
        parse_config(_config({"max_age": 10**400}, {}), "sr.yaml")


@pytest.mark.parametrize("value", [math.nan, math.inf, "9" * 400])
def test_non_finite_durations_are_config_errors(value: object) -> None:
    with pytest.raises(ConfigError, match=r"topics.cmdb.max_age: invalid duration"):
        parse_config(_config({"max_age": value}, {}), "sr.yaml")


@pytest.mark.parametrize("url", ["nats://host:port", "nats://a:4222:5", "nats://:4222"])
def test_url_with_a_bad_port_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match=r"topics.cmdb.target_url: invalid NATS URL"):
        parse_config(_config({"target_url": url}, {}), "sr.yaml")


# ---------------------------------------------------------------- generated configs

SCALARS = (
    st.none() | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(["10s", "5m", "1h", "1d", "-1s", "1h30m", "nats://a:1", "tls://u:p@h:2,nats://x:3",
                       "puppet", "manual", "kv", "memory", "file", "target", "source", "a.b.>", "*", ""])
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)


def _keyed(fields: list[str], values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(fields) | st.text(max_size=8), values, max_size=len(fields))


TOPIC = st.builds(lambda extra, base: {**base, **extra},
                  _keyed(list(TopicConfig.model_fields), VALUES | _keyed(list(TLSConfig.model_fields), VALUES)
                         | _keyed(list(AdvisoryConfig.model_fields), VALUES)),
                  st.fixed_dictionaries({}, optional={k: st.just(v) for k, v in BASE.items()}))
CONFIGS = VALUES | st.builds(
    lambda top, topics: {**top, "topics": topics},
    _keyed([k for k in Config.model_fields if k != "topics"],
           VALUES | _keyed(list(TLSConfig.model_fields), VALUES)),
    st.dictionaries(st.text(max_size=6) | st.integers() | st.none(), TOPIC, max_size=2) | VALUES,
)


@pytest.mark.timeout(120)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIGS)
def test_generated_configs_never_crash_parse_config(data: Any) -> None:
    try:
        config = parse_config(data, "gen.yaml")
    except ConfigError as err:
        assert str(err).startswith("gen.yaml: "), str(err)
    else:
        assert config.topics


def _yaml_or_text(data: Any) -> str:
    try:
        return yaml.safe_dump(data)
    except yaml.YAMLError:
        return str(data)


@pytest.mark.timeout(120)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(st.one_of(CONFIGS.map(_yaml_or_text), st.text(max_size=200)))
def test_cli_never_prints_a_traceback_for_generated_files(tmp_path: Path, text: str) -> None:
    """The console script as a process: exit 2 (config error) and no traceback, whatever the file."""
    try:
        data = yaml.safe_load(text)
        runnable = isinstance(parse_config(data, "x").topics.get("cmdb"), TopicConfig)
    except Exception:  # broken on purpose: exactly what the CLI must report cleanly
        runnable = False
    if runnable:
        return  # a valid config would start replicating: not this test's business
    path = tmp_path / "gen.yaml"
    path.write_text(text)
    result = subprocess.run([sys.executable, "-m", "replicator", "--config", str(path), "--topic", "cmdb"],
                            capture_output=True, text=True, timeout=60)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stderr.startswith("stream-replicator: config error: ")
