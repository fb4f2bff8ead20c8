"""A small Dockerfile and .dockerignore reader for the packaging tests (no Docker engine runs here).

It understands what our Dockerfile uses: parser directives and comments, global ARGs, line
continuations, `FROM <image> AS <name>`, heredocs (`<<"EOF"`), and JSON (exec) forms.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

_HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int
    heredocs: dict[str, str] = field(default_factory=dict)

    def flags(self) -> dict[str, str]:
        """`--from=x --chmod=0755` style flags at the start of the arguments."""
        found = {}
        for word in self.args.split():
            if not word.startswith("--"):
                break
            key, _, value = word[2:].partition("=")
            found[key] = value
        return found

    def words(self) -> list[str]:
        """Arguments after the flags (shell words, or the JSON array of the exec form)."""
        text = self.args.strip()
        if text.startswith("["):
            return list(json.loads(text))
        return [w for w in shlex.split(text) if not w.startswith("--")]

    def exec_form(self) -> list[str]:
        value = json.loads(self.args)
        assert isinstance(value, list), f"line {self.line}: {self.keyword} is not in exec (JSON) form"
        return value


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


def _logical_lines(text: str) -> list[tuple[int, str, dict[str, str]]]:
    lines = text.splitlines()
    result = []
    i = 0
    while i < len(lines):
        start = i
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = []
        while True:
            stripped = line.rstrip()
            if stripped.endswith("\\"):
                parts.append(stripped[:-1])
                # Comment lines inside a continuation are dropped, as Docker does.
                while i < len(lines) and lines[i].lstrip().startswith("#"):
                    i += 1
                if i >= len(lines):
                    break
                line = lines[i]
                i += 1
            else:
                parts.append(stripped)
                break
        logical = " ".join(p.strip() for p in parts)
        heredocs = {}
        for strip_tabs, _, delimiter in _HEREDOC.findall(logical):
            body = []
            while i < len(lines) and (lines[i].lstrip("\t") if strip_tabs else lines[i]) != delimiter:
                body.append(lines[i].lstrip("\t") if strip_tabs else lines[i])
                i += 1
            assert i < len(lines), f"heredoc {delimiter} from line {start + 1} is not terminated"
            i += 1
            heredocs[delimiter] = "\n".join(body) + "\n"
        result.append((start + 1, logical, heredocs))
    return result


def _expand(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


def parse(text: str | None = None) -> dict[str, Stage]:
    """Stages by name (unnamed stages get their index as a name), in file order."""
    text = DOCKERFILE.read_text() if text is None else text
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line, logical, heredocs in _logical_lines(text):
        keyword, _, args = logical.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip(), line, heredocs)
        if instruction.keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--platform")]
            base = _expand(words[0], global_args)
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            current = Stage(name, base, [])
            stages[name] = current
        elif current is None:
            assert instruction.keyword == "ARG", f"line {line}: {keyword} before the first FROM"
            key, _, default = args.strip().partition("=")
            global_args[key] = default
        else:
            current.instructions.append(instruction)
    return stages


def ancestry(stages: dict[str, Stage], name: str) -> list[str]:
    """The stage and the stages it is built FROM, nearest first."""
    chain = [name]
    while stages[chain[-1]].base in stages:
        chain.append(stages[chain[-1]].base)
    return chain


def apt_packages(command: str) -> set[str]:
    """Packages an `apt-get install` in a RUN command installs."""
    packages: set[str] = set()
    for segment in re.split(r"&&|;|\|\|", command):
        words = segment.split()
        if len(words) >= 2 and words[0] in {"apt-get", "apt"} and "install" in words:
            after = words[words.index("install") + 1 :]
            packages.update(w for w in after if not w.startswith("-"))
    return packages


# .dockerignore ------------------------------------------------------------------------------------


def ignore_patterns(path: Path = DOCKERIGNORE) -> list[tuple[bool, str]]:
    """(is_exception, pattern) in file order."""
    patterns = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:].strip() if negated else line
        patterns.append((negated, pattern.strip("/")))
    return patterns


def _translate(pattern: str) -> str:
    """A .dockerignore pattern as a regular expression (Go filepath.Match plus `**`)."""
    regex = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            regex += ".*"
            i += 2
        elif pattern[i] == "*":
            regex += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            regex += "[^/]"
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            regex += "[" + ("^" + body[1:] if body.startswith("^") else body) + "]"
            i = end + 1
        else:
            regex += re.escape(pattern[i])
            i += 1
    return regex


def _match(pattern: str, path: str) -> bool:
    """Docker's matching: a pattern matches the path or one of its parent directories."""
    regex = _translate(pattern)
    parts = path.split("/")
    return any(re.fullmatch(regex, "/".join(parts[:n])) for n in range(1, len(parts) + 1))


def is_ignored(path: str, patterns: list[tuple[bool, str]] | None = None) -> bool:
    """Whether a context-relative path is left out of the build context (the last match wins)."""
    ignored = False
    for negated, pattern in patterns if patterns is not None else ignore_patterns():
        if _match(pattern, path):
            ignored = not negated
    return ignored


def context_files(patterns: list[tuple[bool, str]] | None = None) -> list[str]:
    """Files of the repository that `docker build .` would send (.git and .venv are never walked)."""
    patterns = patterns if patterns is not None else ignore_patterns()
    files: list[str] = []
    for root, dirs, names in os.walk(REPO):
        rel_root = Path(root).relative_to(REPO).as_posix()
        prefix = "" if rel_root == "." else rel_root + "/"
        dirs[:] = sorted(d for d in dirs if (prefix + d) not in {".git", ".venv"})
        files.extend(prefix + n for n in names if not is_ignored(prefix + n, patterns))
    return sorted(files)
