"""Subject rewrite on the target (`target_subject_prefix`, `target_subject_remove`)."""

from __future__ import annotations

from replicator.config.model import TopicConfig


def rewrite_subject(subject: str, prefix: str | None, remove: str | None) -> str:
    """Prefix first, then remove a substring, then tidy the dots (as the legacy tool does)."""
    if prefix:
        subject = f"{prefix}.{subject}"
    if remove:
        subject = subject.replace(remove, "")
    while ".." in subject:
        subject = subject.replace("..", ".")
    return subject.strip(".")


class SubjectRewriter:
    """Caches rewrites: a fleet's subjects repeat, the rewrite need not."""

    def __init__(self, settings: TopicConfig) -> None:
        self.prefix = settings.target_subject_prefix
        self.remove = settings.target_subject_remove
        self.identity = not self.prefix and not self.remove
        self._cache: dict[str, str] = {}

    def __call__(self, subject: str) -> str:
        if self.identity:
            return subject
        out = self._cache.get(subject)
        if out is None:
            out = rewrite_subject(subject, self.prefix, self.remove)
            if len(self._cache) < 100_000:
                self._cache[subject] = out
        return out
