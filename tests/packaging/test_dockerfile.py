"""The Dockerfile, read statically (no Docker engine here): targets, users, what the final stages carry."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml
from dockerfile_support import (
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
    builder = " ".join(i.args for i in stages["builder"].all("RUN"))
    assert "pip wheel --no-deps --wheel-dir /dist ." in builder
    assert re.search(r"/opt/venv/bin/pip install /dist/stream_replicator-\*\.whl", builder)
    spark = " ".join(i.args for i in stages["spark-builder"].all("RUN"))
    assert "[spark]" in spark
    assert ancestry(stages, "spark-builder")[-1] == "builder"


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


def test_spark_entrypoint_script(stages, tmp_path) -> None:
    (copy,) = [c for c in stages["spark"].all("COPY") if c.heredocs]
    assert copy.words()[-1] == "/usr/local/bin/spark-entrypoint"
    assert copy.flags().get("chmod") == "0755"
    (script,) = copy.heredocs.values()
    assert script.startswith("#!/bin/bash\n")
    for word in (
        "driver)",
        "executor)",
        "KubernetesExecutorBackend",
        "--deploy-mode client",
        "exec /usr/bin/tini",
    ):
        assert word in script
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash to syntax-check the entrypoint")
    path = tmp_path / "spark-entrypoint"
    path.write_text(script)
    subprocess.run([bash, "-n", str(path)], check=True, timeout=30)


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
