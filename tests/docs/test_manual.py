"""The manual: README.md is the short tour, docs/ the reference, and both stay true to the code.

- every relative Markdown link in README.md and docs/*.md resolves to a file (and to a heading
  when it has an `#anchor`, with GitHub's slugs);
- every key the config model accepts is documented in docs/configuration.md, and every key
  documented there is accepted: the model's (legacy format) and the Go Stream Replicator format's;
- README.md stays short and starts with the two set-up commands.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from replicator.config import AdvisoryConfig, Config, TLSConfig, TopicConfig
from replicator.config.goformat import GoAdvisory, GoChoria, GoConfig, GoHeartbeats, GoHeartbeatSubject, GoStream, GoTLS
from replicator.config.model import HeartbeatsConfig, HeartbeatSubject

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
CONFIG_PAGE = DOCS / "configuration.md"

ARCHITECTURE = REPO / "ARCHITECTURE.md"

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:[ \t]*<?(\S+?)>?(?:[ \t]+\"[^\"\n]*\")?[ \t]*$", re.MULTILINE)
CODE_SPAN_WRAPPED = re.compile(r"(`+)((?:(?!\n[ \t]*\n).)+?)\1", re.DOTALL)
EXTERNAL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, https:, mailto:, ...


def manual_pages() -> list[Path]:
    return [README, ARCHITECTURE, *sorted(DOCS.glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: rendered text, lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every inline link, image and reference definition outside code."""
    prose = dict(prose_lines(path.read_text(encoding="utf-8")))
    text = "\n".join(prose.get(n, "") for n in range(1, max(prose, default=0) + 1))
    # Code spans may wrap lines (never paragraphs); blank them out, keeping the line numbers.
    text = CODE_SPAN_WRAPPED.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    found = [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in INLINE_LINK.finditer(text)]
    found += [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in REFERENCE_DEF.finditer(text)]
    return sorted(found)


def test_the_manual_exists() -> None:
    assert README.is_file()
    assert {p.name for p in DOCS.glob("*.md")} >= {
        "README.md", "configuration.md", "cli.md", "operator.md", "helm.md", "sampling.md",
        "fleet-health.md", "reliability.md", "security.md", "metrics.md", "benchmarks.md",
        "migration.md", "troubleshooting.md",
    }


@pytest.mark.parametrize("page", manual_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for number, target in links(page):
        if EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(REPO)}:{number}: {target}"
        if not resolved.exists():
            broken.append(f"{where} (no such file)")
            continue
        if anchor:
            if resolved.suffix != ".md" or resolved.is_dir():
                broken.append(f"{where} (an anchor into something that is not a Markdown file)")
            elif anchor not in anchors(resolved):
                broken.append(f"{where} (no heading with that anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_page_links_to_the_others() -> None:
    """No orphan: every docs page is linked from the docs index and from the README."""
    for index in (README, DOCS / "README.md"):
        targets = {
            (index.parent / target.partition("#")[0]).resolve()
            for _, target in links(index)
            if not EXTERNAL.match(target) and target.partition("#")[0]
        }
        orphans = [p.name for p in DOCS.glob("*.md") if p.name != "README.md" and p.resolve() not in targets]
        assert not orphans, f"{index.relative_to(REPO)} does not link to {orphans}"


# --------------------------------------------------------------------------------------------------
# Config keys: the model and docs/configuration.md agree

# The level-2 sections of docs/configuration.md whose tables list one model's keys (first column).
# Dotted names (`advisory.target`) document the parent key and a key of the nested model.
SECTIONS: dict[str, type[BaseModel]] = {
    "Global keys": Config,
    "Topic keys": TopicConfig,
    "TLS settings": TLSConfig,
    "Heartbeats": HeartbeatsConfig,
    "Go format: top-level keys": GoConfig,
    "Go format: stream keys": GoStream,
    "Go format: heartbeats": GoHeartbeats,
}
MODELS: tuple[type[BaseModel], ...] = (Config, TopicConfig, TLSConfig, AdvisoryConfig, HeartbeatsConfig,
                                       HeartbeatSubject, GoConfig, GoStream, GoTLS, GoChoria, GoAdvisory,
                                       GoHeartbeats, GoHeartbeatSubject)
KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def accepted_keys(model: type[BaseModel]) -> dict[str, Any]:
    """Key as written in a config file -> the field's annotation."""
    return {field.alias or name: field.annotation for name, field in model.model_fields.items()}


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model inside `X`, `X | None`, `Optional[X]`, `list[X]`; None for anything else."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is list:
        return nested_model(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        models = [m for m in map(nested_model, get_args(annotation)) if m is not None]
        return models[0] if len(models) == 1 else None
    return None


def documented_tables(path: Path) -> dict[str, list[tuple[int, list[str]]]]:
    """Section title -> (line, backticked names in the first cell) for each table row in it."""
    sections: dict[str, list[tuple[int, list[str]]]] = {}
    current: str | None = None
    previous = ""
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        heading = HEADING.match(line)
        if heading and len(heading.group(1)) <= 2:
            current = heading.group(2).replace("`", "").strip()
            sections.setdefault(current, [])
        elif current and line.lstrip().startswith("|"):
            is_row = not re.fullmatch(r"\s*\|[\s:|-]*\|?\s*", line)
            is_header = not previous.lstrip().startswith("|")
            if is_row and not is_header:
                first_cell = line.strip().strip("|").split("|")[0]
                sections[current].append((number, [m.group(2) for m in CODE_SPAN.finditer(first_cell)]))
        previous = line
    return sections


def documented_keys() -> tuple[dict[type[BaseModel], set[str]], list[str]]:
    """Documented keys per model, and the names in key columns that no model accepts."""
    documented: dict[type[BaseModel], set[str]] = {model: set() for model in MODELS}
    unknown: list[str] = []
    tables = documented_tables(CONFIG_PAGE)
    for title, model in SECTIONS.items():
        assert tables.get(title), f"docs/configuration.md has no '## {title}' section with a key table"
        for number, names in tables[title]:
            if not names:
                unknown.append(f"line {number}: a row of '{title}' names no key in its first column")
            for name in names:
                where = f"`{name}` (line {number}, {title})"
                if not KEY.match(name):
                    unknown.append(where)
                    continue
                parts = name.split(".")
                target: type[BaseModel] | None = model
                for depth, part in enumerate(parts):
                    keys = accepted_keys(target) if target is not None else {}
                    if part not in keys:
                        unknown.append(where)
                        break
                    documented.setdefault(target, set()).add(part)  # type: ignore[arg-type]
                    if depth < len(parts) - 1:
                        target = nested_model(keys[part])
    return documented, unknown


def test_every_config_key_is_documented_and_every_documented_key_exists() -> None:
    documented, unknown = documented_keys()
    missing = [
        f"{model.__name__}.{key}"
        for model in MODELS
        for key in sorted(accepted_keys(model))
        if key not in documented.get(model, set())
    ]
    problems = []
    if missing:
        problems.append("accepted by the config model but not in docs/configuration.md: " + ", ".join(missing))
    if unknown:
        problems.append("documented in docs/configuration.md but not accepted by the model: " + ", ".join(unknown))
    assert not problems, "\n".join(problems)


def test_the_key_table_parser_sees_nested_models() -> None:
    """Guards the check above: dotted names reach the nested model, and an unknown key is caught."""
    assert nested_model(accepted_keys(TopicConfig)["advisory"]) is AdvisoryConfig
    assert nested_model(accepted_keys(TopicConfig)["tls"]) is TLSConfig
    documented, _ = documented_keys()
    assert {"target", "cluster", "age"} <= documented[AdvisoryConfig]
    assert "advisory" in documented[TopicConfig]
    assert nested_model(accepted_keys(GoHeartbeats)["subjects"]) is GoHeartbeatSubject
    assert {"subject", "interval", "headers"} <= documented[GoHeartbeatSubject]
    assert {"ca", "cert", "key"} <= documented[GoTLS] and "collective" in documented[GoChoria]


# --------------------------------------------------------------------------------------------------
# README: a short tour that starts with the set-up commands

COMMANDS = ("make", "stream-replicator", "python", "pip", "kubectl", "helm", "nats", "docker",
            "spark-submit", "git", "cd", "$")


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 300, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_states_make_demo_and_make_test_first() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    first_fence = next(i for i, line in enumerate(lines) if FENCE.match(line))
    end = next(i for i in range(first_fence + 1, len(lines)) if FENCE.match(lines[i]))
    headings = [line for line in lines[:first_fence] if HEADING.match(line)]
    assert headings and slug(HEADING.match(headings[-1]).group(2)) == "quick-start", (  # type: ignore[union-attr]
        "the first code block of README.md belongs in a 'Quick start' section"
    )
    commands = [line.split("#", 1)[0].strip() for line in lines[first_fence + 1:end]]
    commands = [c for c in commands if c]
    assert commands[:2] == ["make demo", "make test"], f"the first commands in README.md are {commands[:2]}"
    before = "\n".join(lines[:first_fence])
    earlier = [span for _, span in CODE_SPAN.findall(before) if span.split()[0] in COMMANDS]
    assert not earlier, f"README.md names other commands before `make demo` and `make test`: {earlier}"


def test_the_header_policy_and_the_error_classes_are_documented_in_full() -> None:
    """Every row of the header policy table and every classified publish error code appears on the
    reliability page, so the manual cannot fall behind the tables the copier runs on."""
    from replicator.copier.failures import CODES
    from replicator.copier.headers import RULES

    page = (DOCS / "reliability.md").read_text()
    for rule in RULES:
        assert f"`{rule.name.rstrip('*')}" in page, rule.name
    missing = [code for code in CODES if str(code) not in page]
    assert not missing, f"error codes classified but not documented: {missing}"
