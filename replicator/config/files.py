"""Config files: read the YAML (legacy `topics:` or the Go tool's `streams:`), validate it, pick a profile."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from replicator.config.errors import ConfigError, format_errors
from replicator.config.goformat import is_go_format, parse_go_config
from replicator.config.model import Config, Profile


def parse_config(data: Any, source: str = "<config>") -> Config:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: the config must be a YAML mapping with a 'topics' map (or, as the Go "
                          "Stream Replicator writes it, 'name' and a 'streams' list)")
    if is_go_format(dict(data)):
        go = parse_go_config(dict(data), source)
        go.config._warnings = go.warnings
        return go.config
    try:
        config = Config.model_validate(dict(data))
    except ValidationError as err:
        raise ConfigError(format_errors(err, source)) from None
    return config


def load_config(path: str | os.PathLike[str]) -> Config:
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{source}: cannot read config: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{source}: not a UTF-8 text file (byte {err.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{source}: invalid YAML{where}: {getattr(err, 'problem', err)}") from None
    return parse_config(data, source)


def load_profile(path: str | os.PathLike[str], topic: str, instance: str | None = None) -> Profile:
    return Profile(load_config(path), topic, instance=instance, source=str(path))
