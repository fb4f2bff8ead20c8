"""What the built images carry: OCI labels, the user, the package version of pyproject.toml, the
compiled data path but no compiler, and neither the machine's pip configuration nor its own CA
certificates in any layer."""

from __future__ import annotations

import base64
import os
import re
import tomllib
from pathlib import Path

import pytest

from tests.images.conftest import TAGS
from tests.images.support import REPO, Podman, RunOptions, build_module, layer_files

build = build_module()

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
TITLES = {"worker": "stream-replicator", "spark": "stream-replicator-spark"}
ENTRYPOINTS = {"worker": ["stream-replicator"], "spark": ["/usr/local/bin/spark-entrypoint"]}
# Compilers, linkers and build systems: none may be in a final image.
BUILD_PACKAGES = {"build-essential", "gcc", "g++", "cpp", "clang", "make", "cmake", "binutils", "libc6-dev",
                  "python3-dev", "rustc", "cargo", "golang", "gfortran", "ninja-build", "pkg-config"}
BUILD_COMMANDS = ("gcc", "cc", "c++", "g++", "cpp", "clang", "make", "cmake", "ld", "as", "rustc", "go")
# Files that hold pip or credential configuration.
CONFIG_NAMES = {"pip.conf", "pip.ini", ".pypirc", ".netrc", ".git-credentials"}

pytestmark = [pytest.mark.parametrize("target", ["worker", "spark"]), pytest.mark.usefixtures("built")]


def _python(podman: Podman, target: str, code: str, tmp_path: Path) -> str:
    # The spark entrypoint passes commands through; the worker's runs stream-replicator.
    options = RunOptions(entrypoint=["python"] if target == "worker" else None)
    args = ["-c", code] if target == "worker" else ["python", "-c", code]
    status, out = podman.run(TAGS[target], args, options, tmp_path / "python.log", 60)
    assert status == 0, out
    return out


def test_labels_user_and_entrypoint(podman: Podman, target: str) -> None:
    info = podman.inspect(TAGS[target])
    labels = info["Labels"]
    assert labels["org.opencontainers.image.title"] == TITLES[target]
    assert labels["org.opencontainers.image.description"]
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.base.name"]
    if (REPO / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", labels["org.opencontainers.image.revision"])
    assert info["Config"]["User"] == "10001:10001"
    assert info["Config"]["Entrypoint"] == ENTRYPOINTS[target]


def test_package_version_is_pyprojects(podman: Podman, target: str, tmp_path: Path) -> None:
    out = _python(podman, target, "import importlib.metadata as m; print(m.version('stream-replicator'))", tmp_path)
    assert out.split() == [VERSION]


def test_data_path_runs_compiled(podman: Podman, target: str, tmp_path: Path) -> None:
    """The wheel stage compiles the hot modules (setup.py); the final stage needs no compiler to run them."""
    out = _python(podman, target, "from replicator.service.compiled import describe; print(describe())", tmp_path)
    compiled = "wire, limiter, admission, table, body, keys, transform, window, headers, subjects"
    assert f"data path compiled (mypyc): {compiled}" in out, out


def test_no_compiler_or_build_tool(podman: Podman, target: str, tmp_path: Path) -> None:
    code = (
        "import shutil, subprocess; "
        "print(subprocess.run(['dpkg-query', '-W', '-f', '${Package}\\n'], capture_output=True, text=True).stdout); "
        f"print('FOUND', *[c for c in {BUILD_COMMANDS!r} if shutil.which(c)])"
    )
    out = _python(podman, target, code, tmp_path)
    packages = {line.strip() for line in out.splitlines() if line.strip() and not line.startswith("FOUND")}
    assert {"libc6", "python3.11"} <= packages, out[:2000]
    assert not packages & BUILD_PACKAGES
    assert not [p for p in packages if p.endswith("-dev")]
    (found,) = [line for line in out.splitlines() if line.startswith("FOUND")]
    assert found.split() == ["FOUND"], found


def _certificates(text: str) -> dict[str, bytes]:
    """PEM body (one line, the key) -> DER bytes, for every certificate of a bundle."""
    found = {}
    for body in re.findall(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", text, re.S):
        joined = "".join(body.split())
        found[joined] = base64.b64decode(joined)
    return found


def _machine_only_certificates() -> dict[str, bytes]:
    """Certificates the build machine trusts besides the distribution's public ones (its own CAs, as
    in the CA bundle the build is given): if any of them shows up in a layer, the build baked it in."""
    bundle = build.system_ca_bundle(os.environ)
    if bundle is None:
        return {}
    public: dict[str, bytes] = {}
    for crt in Path("/usr/share/ca-certificates").rglob("*.crt"):
        public.update(_certificates(crt.read_text(errors="replace")))
    return {k: v for k, v in _certificates(Path(bundle).read_text()).items() if k not in public}


def test_no_pip_configuration_or_machine_certificates_in_any_layer(
    podman: Podman, target: str, tmp_path: Path
) -> None:
    layers = podman.layers(TAGS[target], tmp_path / "oci")
    foreign = _machine_only_certificates()
    # The signature (a certificate's unique tail) in PEM and DER form: a bundle, a copy or a Java
    # keystore holding one would show.
    # PEM wraps at 64 characters: the last full line, as it stands in a file.
    markers = [pem[(len(pem) // 64 - 1) * 64 : len(pem) // 64 * 64].encode() for pem in foreign]
    markers += [der[-64:] for der in foreign.values()]
    # The build's pip configuration names its mounted paths: a copy of it would hold them.
    markers.append(f"{build.CONTAINER_HOME}/{build.LOCAL_DIRS}/".encode())
    seen = 0
    for layer in layers:
        for member, tar in layer_files(layer):
            name = member.name.lstrip("./")
            basename = name.rsplit("/", 1)[-1].removeprefix(".wh.")
            assert basename not in CONFIG_NAMES, f"{name} in a layer of {TAGS[target]}"
            assert "/.config/pip" not in f"/{name}" and ".pip-local" not in name, name
            if member.isfile():
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                seen += 1
                for marker in markers:
                    assert marker not in data, f"{name} holds the build's pip configuration or CA bundle"
    assert seen
    history = podman.command(["history", "--no-trunc", "--format", "{{.CreatedBy}}", TAGS[target]], check=True)
    assert ".pip-local" not in history.stdout and "pip.conf" not in history.stdout
