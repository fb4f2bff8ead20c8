"""Config: legacy files load unchanged; broken ones exit 2 with a message naming the key and file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from replicator.config import ConfigError, Profile, load_config, parse_config
from replicator.config.durations import parse_duration

LEGACY = sorted((Path(__file__).parent.parent / "data" / "legacy").glob("*.yaml"))


@pytest.mark.parametrize("path", LEGACY, ids=lambda p: p.stem)
def test_legacy_readme_configs_load_unchanged(path):
    config = load_config(path)
    assert config.topics


def test_legacy_names():
    config = load_config(Path(__file__).parent.parent / "data" / "legacy" / "ordered.yaml")
    p = Profile(config, "cmdb")
    assert p.worker_names() == ["dc1_cmdb_acme_cmdb_stream_replicator_0"]
    assert p.durable_name == "dc1_cmdb_acme_cmdb_stream_replicator"
    assert p.settings.ordered
    named = Profile(load_config(Path(__file__).parent.parent / "data" / "legacy" / "names.yaml"), "cmdb")
    assert named.worker_names()[0] == "cmdb_replicatorA_0" and named.worker_names()[-1] == "cmdb_replicatorA_9"
    assert named.group_name == "cmdb" and not named.settings.ordered
    scaled = Profile(load_config(Path(__file__).parent.parent / "data" / "legacy" / "scaled.yaml"), "cmdb")
    assert scaled.group_name == "acme_cmdb_stream_replicator_grp"
    assert Profile(config, "cmdb", instance="pod-7").worker_names() == [
        "dc1_cmdb_acme_cmdb_stream_replicator_pod-7_0"
    ]


def test_puppet_layout_files():
    config = load_config(Path(__file__).parent.parent / "data" / "legacy" / "tls_puppet.yaml")
    tls = Profile(config, "cmdb").tls_for("source")
    assert tls is not None
    assert tls.files() == (
        "/etc/stream-replicator/ssl/certs/ca.pem",
        "/etc/stream-replicator/ssl/certs/foo.replicator.pem",
        "/etc/stream-replicator/ssl/private_keys/foo.replicator.pem",
    )


@pytest.mark.parametrize(
    ("text", "seconds"), [("10s", 10), ("5m", 300), ("1h", 3600), ("1d", 86400), ("1h30m", 5400), (45, 45)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


BASE = {"topic": "acme.cmdb", "source_url": "nats://a:4222", "target_url": "nats://b:4222"}

BROKEN = [
    ({"age": "5x", "inspect": "host"}, "topics.cmdb.age", "invalid duration"),
    ({"workers": "many"}, "topics.cmdb.workers", "integer"),
    ({"workers": 0}, "topics.cmdb.workers", "greater than or equal to 1"),
    ({"target_replicas": 7}, "topics.cmdb.target_replicas", "less than or equal to 5"),
    ({"colour": "blue"}, "topics.cmdb.colour", "unknown key"),
    ({"inspect": "host", "inspect_header": "X-Host", "age": "1h"}, "topics.cmdb", "only one of inspect"),
    ({"source_url": ""}, "topics.cmdb.source_url", "at least one NATS URL"),
    ({"target_url": "http://x"}, "topics.cmdb.target_url", "invalid NATS URL"),
    ({"inspect": "host"}, "topics.cmdb", "needs age"),
    ({"limiter_state": "redis", "inspect": "h", "age": "1h"}, "topics.cmdb.limiter_state", "memory"),
    ({"advisory": {"target": "a.b", "cluster": "moon"}, "inspect": "h", "age": "1h"},
     "topics.cmdb.advisory.cluster", "target"),
    ({"max_age": "-1"}, "topics.cmdb.max_age", "invalid duration"),
    ({"start_sequence": 5, "start_at_end": True}, "topics.cmdb", "only one start position"),
    ({"tls": {"scheme": "puppet"}}, "topics.cmdb.tls", "ssl_dir"),
    ({"monitor": 70000}, "topics.cmdb.monitor", "less than or equal"),
    ({"source_stream": "bad.name"}, "topics.cmdb.source_stream", "not a valid JetStream name"),
]


@pytest.mark.parametrize(("override", "key", "text"), BROKEN, ids=[b[1] + ":" + b[2] for b in BROKEN])
def test_broken_configs_name_the_key_and_file(override, key, text):
    topic = {**BASE, **override}
    topic = {k: v for k, v in topic.items() if v != ""} if override.get("source_url") != "" else topic
    with pytest.raises(ConfigError) as err:
        parse_config({"topics": {"cmdb": topic}}, "sr.yaml")
    message = str(err.value)
    assert message.startswith(f"sr.yaml: {key}")
    assert text in message


def test_missing_required_and_empty_topics():
    with pytest.raises(ConfigError, match=r"sr.yaml: topics.cmdb.target_url: required key is missing"):
        parse_config({"topics": {"cmdb": {"topic": "a", "source_url": "nats://a:1"}}}, "sr.yaml")
    with pytest.raises(ConfigError, match="at least one topic"):
        parse_config({"topics": {}}, "sr.yaml")
    with pytest.raises(ConfigError, match="YAML mapping"):
        parse_config(["x"], "sr.yaml")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replicator", *args], capture_output=True, text=True, timeout=60)


def test_cli_config_errors_exit_2_without_traceback(tmp_path):
    bad = tmp_path / "sr.yaml"
    bad.write_text(yaml.safe_dump({"topics": {"cmdb": {**BASE, "age": "soon", "inspect": "host"}}}))
    result = _cli("--config", str(bad), "--topic", "cmdb")
    assert result.returncode == 2
    assert f"{bad}: topics.cmdb.age: invalid duration 'soon'" in result.stderr
    assert "Traceback" not in result.stderr
    result = _cli("--config", str(bad.with_name("missing.yaml")), "--topic", "cmdb")
    assert result.returncode == 2 and "cannot read config" in result.stderr
    bad.write_text("topics: [unclosed")
    result = _cli("--config", str(bad), "--topic", "cmdb")
    assert result.returncode == 2 and "invalid YAML at line 1" in result.stderr
    bad.write_text(yaml.safe_dump({"topics": {"cmdb": BASE}}))
    result = _cli("--config", str(bad), "--topic", "other")
    assert result.returncode == 2 and "no topic 'other'" in result.stderr


def test_cli_unreadable_tls_and_credentials_files(tmp_path):
    cfg = tmp_path / "sr.yaml"
    topic = {**BASE, "tls": {"scheme": "manual", "ca": str(tmp_path / "nope.pem")}}
    cfg.write_text(yaml.safe_dump({"topics": {"cmdb": topic}}))
    result = _cli("--config", str(cfg), "--topic", "cmdb")
    assert result.returncode == 2
    assert "topics.cmdb.tls: source TLS ca file" in result.stderr and "not readable" in result.stderr
    topic = {**BASE, "target_credentials": str(tmp_path / "user.creds")}
    cfg.write_text(yaml.safe_dump({"topics": {"cmdb": topic}}))
    result = _cli("--config", str(cfg), "--topic", "cmdb")
    assert result.returncode == 2 and "topics.cmdb.target_credentials" in result.stderr


def test_credentials_never_in_errors():
    with pytest.raises(ConfigError) as err:
        parse_config({"topics": {"c": {**BASE, "source_url": "http://user:s3cret@host:4222"}}}, "sr.yaml")
    assert "s3cret" not in str(err.value)
