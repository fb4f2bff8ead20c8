"""The Dockerfile, read statically (no Docker engine here): targets, users, what the final stages carry."""

from __future__ import annotations

import os
import posixpath
import re

import pytest
import yaml
from dockerfile_support import (
    DOCKERFILE,
    REPO,
    ancestry,
    apt_packages,
    context_files,
    ignore_patterns,
    is_ignored,
    parse,
)

FINAL = ("worker", "spark")
UID = "10001"
# Compilers and build tools that must never reach a final image.
BUILD_TOOLS = {
    "build-essential",
    "gcc",
    "g++",
    "cpp",
    "clang",
    "make",
    "cmake",
    "ninja-build",
    "gfortran",
    "rustc",
    "cargo",
    "golang",
    "libc6-dev",
    "python3-dev",
    "libffi-dev",
    "libssl-dev",
    "pkg-config",
}
BUILD_COMMANDS = re.compile(r"\b(gcc|g\+\+|clang|cc|make|cmake|pip\s+wheel|python\s+-m\s+build|setup\.py)\b")


@pytest.fixture(scope="module")
def stages():
    return parse()


def test_targets_exist(stages) -> None:
    for name in (*FINAL, "builder"):
        assert name in stages, f"no stage named {name!r}"


@pytest.mark.parametrize("target", FINAL)
def test_final_stages_start_from_slim_python_not_from_a_build_stage(stages, target: str) -> None:
    assert ancestry(stages, target) == [target], f"{target} is built FROM another stage"
    assert re.fullmatch(r"python:3\.11-slim(-[a-z]+)?", stages[target].base), stages[target].base


@pytest.mark.parametrize("target", FINAL)
def test_final_stages_run_as_the_non_root_user(stages, target: str) -> None:
    stage = stages[target]
    user = stage.last("USER")
    assert user is not None, f"{target} has no USER"
    uid, _, gid = user.args.partition(":")
    # Numeric, so Kubernetes' runAsNonRoot can check it without /etc/passwd.
    assert uid == UID and gid in {"", UID}
    assert all(i.line < user.line for i in stage.all("RUN")), "RUN after USER"
    runs = " ".join(i.args for i in stage.all("RUN"))
    assert f"--uid {UID}" in runs, f"{target} does not create the user {UID}"


def test_chart_runs_the_image_user() -> None:
    values = yaml.safe_load((REPO / "helm" / "stream-replicator" / "values.yaml").read_text())
    assert str(values["podSecurityContext"]["runAsUser"]) == UID
    assert values["podSecurityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("target", FINAL)
def test_no_build_tools_in_final_stages(stages, target: str) -> None:
    stage = stages[target]
    for run in stage.all("RUN"):
        assert not apt_packages(run.args) & BUILD_TOOLS, run.args
        assert not re.search(r"-dev\b", " ".join(apt_packages(run.args))), run.args
        assert not BUILD_COMMANDS.search(run.args), run.args
        if "apt-get install" in run.args:
            assert "--no-install-recommends" in run.args and "rm -rf /var/lib/apt/lists/*" in run.args
    # Only the finished virtualenv comes from the build stages.
    for copy in stage.all("COPY"):
        source = copy.flags().get("from")
        if source is not None:
            assert source in stages and source != target
            assert copy.words() == ["/opt/venv", "/opt/venv"], copy.args


def test_builder_builds_the_wheel_and_installs_it(stages) -> None:
    wheel = " ".join(i.args for i in stages["wheel"].all("RUN"))
    assert "pip wheel --no-deps --wheel-dir /dist /src" in wheel
    # ... compiled (setup.py): a build that cannot compile fails rather than ship the slower worker.
    assert "STREAM_REPLICATOR_COMPILE=1 /opt/venv/bin/pip wheel" in wheel
    assert "gcc" in wheel
    for name in ("builder", "spark-builder"):
        runs = " ".join(i.args for i in stages[name].all("RUN"))
        assert re.search(r"/opt/venv/bin/pip install --no-deps /dist/stream_replicator-\*\.whl", runs), name
        assert "/opt/venv/bin/pip check" in runs, name
        assert [c.flags().get("from") for c in stages[name].all("COPY")] == ["wheel"]
        assert ancestry(stages, name) == [name, "deps"]
    # Dependencies come from pyproject.toml alone (a layer that survives source changes).
    deps = stages["deps"]
    assert [c.words() for c in deps.all("COPY")] == [["pyproject.toml", "/src/pyproject.toml"]]
    assert "['dependencies']" in " ".join(i.args for i in deps.all("RUN"))
    assert "['optional-dependencies']['spark']" in " ".join(i.args for i in stages["spark-builder"].all("RUN"))


def _with_workdir(stages, name: str) -> list[tuple[str, object]]:
    """(working directory, instruction) for a stage's instructions, inherited stages first."""
    workdir = "/"
    found = []
    for stage_name in reversed(ancestry(stages, name)):
        for instruction in stages[stage_name].instructions:
            if instruction.keyword == "WORKDIR":
                workdir = posixpath.join(workdir, instruction.args.strip())
            found.append((workdir, instruction))
    return found


def _folders_holding_operator(stages, name: str) -> set[str]:
    """Directories that receive the project's `operator/` folder (the name the stdlib also uses)."""
    folders = set()
    for workdir, copy in _with_workdir(stages, name):
        if copy.keyword == "COPY" and {"operator", "operator/"} & set(copy.words()[:-1]):
            dest = posixpath.normpath(posixpath.join(workdir, copy.words()[-1]))
            folders.add(posixpath.dirname(dest))
    return folders


@pytest.mark.parametrize("name", ["deps", "wheel", "builder", "spark-builder", "worker", "spark"])
def test_no_python_runs_next_to_the_operator_folder(stages, name: str) -> None:
    """`python -m` puts the working directory first on sys.path: a folder named `operator` there
    shadows the standard library's `operator` module and Python fails to start (issue 16)."""
    shadowing = _folders_holding_operator(stages, name)
    for workdir, run in _with_workdir(stages, name):
        if run.keyword == "RUN" and re.search(r"\bpython3?\b|\bpip\b", run.args):
            assert workdir not in shadowing, f"{name}: {run.args!r} runs in {workdir}, next to operator/"


def test_plain_dockerfile_syntax() -> None:
    """No BuildKit-only syntax: buildah/podman and kaniko build it too."""
    text = DOCKERFILE.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.MULTILINE), "a BuildKit frontend directive"
    for stage in parse(text).values():
        for instruction in stage.instructions:
            assert not instruction.heredocs, f"line {instruction.line}: a heredoc"
            flags = instruction.flags()
            assert "mount" not in flags, f"line {instruction.line}: RUN --mount"
            # docker's classic builder knows only --from (COPY) and --chown.
            assert not set(flags) - {"from", "chown"}, f"line {instruction.line}: {instruction.args}"


def test_worker_target(stages) -> None:
    worker = stages["worker"]
    assert worker.last("ENTRYPOINT").exec_form() == ["stream-replicator"]
    assert [c.words()[0] for c in worker.all("COPY")] == ["/opt/venv"]
    assert any("PATH=/opt/venv/bin:$PATH" in e.args for e in worker.all("ENV"))
    copied_from = {c.flags()["from"] for c in worker.all("COPY")}
    assert copied_from == {"builder"}  # the replicator and the operator, without PySpark


def test_spark_target(stages) -> None:
    spark = stages["spark"]
    runs = " ".join(i.args for i in spark.all("RUN"))
    packages = set().union(*(apt_packages(r.args) for r in spark.all("RUN")))
    assert "openjdk-17-jre-headless" in packages
    assert {c.flags().get("from") for c in spark.all("COPY")} >= {"spark-builder"}
    # The Spark application path the ScheduledSparkApplication uses, checked at build time.
    assert "test -f /app/replicator/fleet_health/app.py" in runs
    assert "ln -s /opt/venv/lib/python3.11/site-packages/replicator /app/replicator" in runs
    env = " ".join(e.args for e in spark.all("ENV"))
    assert "SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark" in env
    assert "JAVA_HOME=/opt/java" in env
    entrypoint = spark.last("ENTRYPOINT").exec_form()
    assert entrypoint == ["/usr/local/bin/spark-entrypoint"]


def test_spark_entrypoint_is_a_file_of_the_repository(stages) -> None:
    (copy,) = [c for c in stages["spark"].all("COPY") if "from" not in c.flags()]
    assert copy.words() == ["images/spark-entrypoint", "/usr/local/bin/spark-entrypoint"]
    script = REPO / "images" / "spark-entrypoint"
    assert os.access(script, os.X_OK), "images/spark-entrypoint is not executable"
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n")
    for word in ("driver)", "executor)", "KubernetesExecutorBackend", "--deploy-mode client", "exec /usr/bin/tini"):
        assert word in text
    # shellcheck (tests/packaging/test_scripts.py) and the image tests (tests/images) check the rest.


def test_dockerignore_sends_what_the_dockerfile_copies(stages) -> None:
    patterns = ignore_patterns()
    for stage in stages.values():
        for copy in stage.all("COPY"):
            if "from" in copy.flags() or copy.heredocs:
                continue
            for source in copy.words()[:-1]:
                assert not is_ignored(source.rstrip("/"), patterns), f"{source} is excluded by .dockerignore"
    sent = context_files(patterns)
    assert "pyproject.toml" in sent and "README.md" in sent
    assert any(f.startswith("replicator/") for f in sent) and any(f.startswith("operator/") for f in sent)
    for path in sent:
        assert "__pycache__" not in path and not path.endswith(".pyc"), path
        assert not path.startswith(("tests/", "helm/", ".venv/", ".git/", "dist/", "build/")), path


def test_dockerignore_matcher() -> None:
    patterns = [(False, "*"), (True, "src"), (False, "**/__pycache__"), (False, "**/*.py[cod]")]
    assert is_ignored("tests/test_x.py", patterns)
    assert not is_ignored("src/pkg/mod.py", patterns)
    assert is_ignored("src/pkg/__pycache__/mod.cpython-311.pyc", patterns)
    assert is_ignored("src/pkg/mod.pyc", patterns)
