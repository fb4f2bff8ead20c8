"""Reloading a running process's config: which profiles a new file adds, changes or removes, and
the watch that notices a new file.

A profile is compared by everything its copy depends on (`fingerprint`): its topic settings, the
globals a profile reads (TLS, `state_dir`, the site `name`), its Go-format names and the process's
instance. The monitor port is the process's, not the copy's, so a profile whose only change is its
`monitor` key is left running. The watch compares the file's bytes, so it follows a ConfigMap
update (the kubelet writes the new files and swaps its `..data` symlink in one rename), an editor's
rename over the file and an in-place rewrite alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from replicator.config.model import Config, Profile

WATCH_INTERVAL = 2.0  # seconds between reads of the config file (a kubelet syncs a ConfigMap in about a minute)

Loader = Callable[[], tuple[Config, list[Profile]]]
"""Reads the config file again: the new config and the profiles this process runs from it, their
files checked (raises `ConfigError`)."""


def fingerprint(profile: Profile) -> tuple[object, ...]:
    """What a profile's copy depends on; equal fingerprints need no restart."""
    config = profile.config
    return (profile.profile, profile.settings.model_dump(exclude={"monitor"}), config.tls, config.state_dir,
            config.name, profile.go, profile.instance)


@dataclass(frozen=True)
class Plan:
    """A reload's changes: stop `stop` (removed, and the old copies of changed ones) before starting
    `start` (added, and the new copies of changed ones); `kept` are left alone."""

    start: list[Profile]
    stop: list[str]
    kept: list[str]

    @property
    def empty(self) -> bool:
        return not self.start and not self.stop

    def describe(self, running: Mapping[str, Profile]) -> str:
        added = [p.profile for p in self.start if p.profile not in running]
        changed = [p.profile for p in self.start if p.profile in running]
        removed = [name for name in self.stop if name not in {p.profile for p in self.start}]
        parts = [f"{what} {', '.join(names)}" for what, names in
                 (("added", added), ("changed", changed), ("removed", removed)) if names]
        return "; ".join(parts) + f"; {len(self.kept)} unchanged"


def plan(running: Mapping[str, Profile], wanted: Sequence[Profile]) -> Plan:
    """The changes that take `running` (profile name -> profile) to `wanted`."""
    by_name = {p.profile: p for p in wanted}
    start = [p for p in wanted if p.profile not in running or fingerprint(running[p.profile]) != fingerprint(p)]
    restarted = {p.profile for p in start}
    stop = [name for name in running if name not in by_name or name in restarted]
    kept = [name for name in running if name in by_name and name not in restarted]
    return Plan(start, stop, kept)


class ConfigWatch:
    """Tells when the file at `path` holds different bytes than when last looked at."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.seen = self._digest()

    def _digest(self) -> str:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError as err:  # gone for a moment (a tool that deletes and writes again): a change too
            return f"unreadable: {err.strerror}"

    def changed(self) -> bool:
        """True once per change; a half-written file read mid-write is a change, and so is the
        complete file after it, so a reload that failed on the first is tried again."""
        digest = self._digest()
        if digest == self.seen:
            return False
        self.seen = digest
        return True
