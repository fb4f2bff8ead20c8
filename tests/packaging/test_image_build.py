"""images/build.py (`make image`) without building: the tags, and how the machine's pip
configuration reaches the build (read-only mounts, never a layer). tests/images runs real builds."""

from __future__ import annotations

import configparser
import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from dockerfile_support import REPO
from replication_operator.build import spark_application
from replication_operator.build.children import BuildOptions
from replication_operator.model import images
from replication_operator.settings import OperatorConfig


def _load() -> ModuleType:
    if "image_build" not in sys.modules:
        spec = importlib.util.spec_from_file_location("image_build", REPO / "images" / "build.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules["image_build"] = module
        spec.loader.exec_module(module)
    return sys.modules["image_build"]


build = _load()


def test_make_image_tags_what_the_operator_and_the_chart_run() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert images.VERSION == version
    tags = build.image_tags()
    assert tags == {"worker": images.DEFAULT_WORKER_IMAGE, "spark": images.DEFAULT_SPARK_IMAGE}
    assert build.REPOSITORY == images.REPOSITORY
    values = yaml.safe_load((REPO / "helm" / "stream-replicator" / "values.yaml").read_text())
    assert values["image"]["repository"] == build.REPOSITORY
    # The operator's defaults, without the chart's environment.
    config = OperatorConfig.from_env({})
    assert (config.worker_image, config.spark_image) == (tags["worker"], tags["spark"])
    assert BuildOptions().worker_image == tags["worker"]
    assert spark_application.DEFAULT_IMAGE == tags["spark"]
    env = {images.WORKER_IMAGE_ENV: "r/w:1", images.SPARK_IMAGE_ENV: "r/s:1"}
    assert (OperatorConfig.from_env(env).worker_image, OperatorConfig.from_env(env).spark_image) == ("r/w:1", "r/s:1")


def test_pip_settings_merge_files_then_environment(tmp_path: Path) -> None:
    first, second = tmp_path / "etc.conf", tmp_path / "user.conf"
    first.write_text("[global]\nindex-url = https://a.example/simple\ntimeout = 5\n[install]\nno-compile = yes\n")
    second.write_text("[global]\ntimeout = 9\ncache-dir = /var/cache/pip\n")
    env = {"PIP_EXTRA_INDEX_URL": "https://b.example/simple", "PIP_CONFIG_FILE": str(second), "HOME": "/nowhere"}
    settings = build.merged_pip_settings([first, second, tmp_path / "missing.conf"], env)
    assert settings == {
        "global": {"index-url": "https://a.example/simple", "timeout": "9", "extra-index-url": "https://b.example/simple"},
        "install": {"no-compile": "yes"},
    }
    files = build.pip_config_files({"HOME": "/h", "PIP_CONFIG_FILE": "/x/pip.conf"})
    assert files[-3:] == [Path("/h/.pip/pip.conf"), Path("/h/.config/pip/pip.conf"), Path("/x/pip.conf")]
    assert Path("/etc/pip.conf") in files


def test_pip_mounts_plan(tmp_path: Path) -> None:
    wheels, index = tmp_path / "wheels", tmp_path / "mirror" / "simple"
    wheels.mkdir()
    index.mkdir(parents=True)
    ca = tmp_path / "ca.pem"
    ca.write_text("a CA")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch<=2.14.1\n")
    settings = {
        "global": {
            "find-links": f"{wheels} /gone https://c.example/links",
            "extra-index-url": f"file://{index} https://d.example/simple file:///gone/simple",
            "cert": str(ca),
            "constraint": f"{constraints} /gone/constraints.txt",
        }
    }
    plan = build.plan_pip_mounts(settings, system_ca=Path("/etc/ssl/certs/ca-certificates.crt"))
    parsed = configparser.RawConfigParser()
    parsed.read_string(plan.config)
    home = f"{build.CONTAINER_HOME}/{build.LOCAL_DIRS}"
    assert dict(parsed["global"]) == {
        "find-links": f"{home}/0 https://c.example/links",
        # An index's pages link to its files relatively: its parent is what is mounted.
        "extra-index-url": f"file://{home}/1/simple https://d.example/simple",
        "cert": f"{home}/cert-0.pem",
        # A machine's pip constraints (a package cap) hold in the build too.
        "constraint": f"{home}/constraint-1.txt",
    }
    assert plan.files == {ca: f"{home}/cert-0.pem", constraints: f"{home}/constraint-1.txt"}
    assert plan.directories == {wheels: f"{home}/0", index.parent: f"{home}/1"}
    # Without a configured `cert`, pip in the build trusts the machine's bundle.
    plan = build.plan_pip_mounts({}, system_ca=ca)
    assert plan.files == {ca: f"{home}/cert-0.pem"} and f"cert = {home}/cert-0.pem" in plan.config


def test_pip_volumes_are_read_only_and_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf, ca, wheels = tmp_path / "pip.conf", tmp_path / "ca.pem", tmp_path / "wheels"
    ca.write_text("a CA")
    wheels.mkdir()
    conf.write_text(f"[global]\nfind-links = {wheels}\ncert = {ca}\n")
    env = {"HOME": str(tmp_path / "home"), "PIP_CONFIG_FILE": str(conf), "XDG_CONFIG_DIRS": str(tmp_path / "none")}
    monkeypatch.setattr(build, "pip_config_files", lambda e: [conf])
    with build.pip_volumes(env) as volumes:
        pairs = [volumes[i + 1] for i in range(0, len(volumes), 2)]
        assert all(v == "--volume" for v in volumes[::2])
        assert all(p.endswith(":ro") for p in pairs)
        home = Path(pairs[0].split(":")[0])
        assert pairs[0] == f"{home}:{build.CONTAINER_HOME}:ro"
        assert pairs[1] == f"{wheels}:{build.CONTAINER_HOME}/{build.LOCAL_DIRS}/0:ro"
        written = (home / build.PIP_CONF).read_text()
        assert f"cert = {build.CONTAINER_HOME}/{build.LOCAL_DIRS}/cert-0.pem" in written
        assert (home / build.LOCAL_DIRS / "cert-0.pem").read_text() == "a CA"
        assert (home / build.LOCAL_DIRS / "0").is_dir()  # the mount point, inside the mounted home
    assert not home.exists()


def test_build_commands() -> None:
    labels = {"org.opencontainers.image.version": "0.1.0"}
    argv = build.build_command("buildah", "spark", "r:1-spark", "base:1", labels)
    assert argv[:5] == ["buildah", "build", "--isolation", "chroot", "--layers"]
    for pair in (["--target", "spark"], ["--tag", "r:1-spark"], ["--build-arg", "PYTHON_IMAGE=base:1"],
                 ["--label", "org.opencontainers.image.version=0.1.0"], ["--file", str(REPO / "Dockerfile")]):
        assert any(argv[i : i + 2] == pair for i in range(len(argv))), pair
    assert build.build_command("docker", "worker", "r:1", "base:1", {})[:2] == ["docker", "build"]


def test_base_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A local registry base, else a local stand-in (no pull attempt), else the pull, else a new stand-in."""
    local: set[str] = set()
    monkeypatch.setattr(build, "image_exists", lambda tool, ref: ref in local)

    def no_tool(*args: object, **kwargs: object) -> None:
        raise AssertionError("ran a tool")

    monkeypatch.setattr(build, "run", no_tool)
    monkeypatch.setattr(build.subprocess, "run", no_tool)
    assert build.resolve_base("buildah", "registry.example/python:3.11") == "registry.example/python:3.11"
    local.add(build.STANDIN_BASE)
    assert build.resolve_base("buildah", None) == build.STANDIN_BASE
    local.add(build.REGISTRY_BASE)
    assert build.resolve_base("buildah", None) == build.REGISTRY_BASE
    # images/bootstrap-base makes the stand-in under the name build.py looks for.
    assert f'tag="{build.STANDIN_BASE}"' in (REPO / "images" / "bootstrap-base").read_text()
