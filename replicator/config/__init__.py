"""The config: the model every format maps to, the file loaders, durations and config errors.

The package's public names are re-exported here: `from replicator.config import load_profile`.
"""

from replicator.config.errors import ConfigError
from replicator.config.files import load_config, load_profile, parse_config
from replicator.config.model import AdvisoryConfig, Config, Profile, TLSConfig, TopicConfig, redact_url

__all__ = [
    "AdvisoryConfig",
    "Config",
    "ConfigError",
    "Profile",
    "TLSConfig",
    "TopicConfig",
    "load_config",
    "load_profile",
    "parse_config",
    "redact_url",
]
