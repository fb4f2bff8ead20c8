"""The wheel, built from exactly what the Docker build context sends, installed into a clean venv.

No network: the wheel builds without isolation from the running venv's setuptools, and the clean
venv reaches the third-party dependencies through a .pth line pointing at the running venv's
site-packages. A directory added by a .pth file has its own .pth files ignored, so the running
venv's editable install of this project is invisible: the project is imported from the wheel.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from dockerfile_support import REPO, context_files

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]


def clean_env(keep_pythonpath: bool = False) -> dict[str, str]:
    drop = {"PYTHONHOME", "VIRTUAL_ENV"} | (set() if keep_pythonpath else {"PYTHONPATH"})
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PIP_NO_INDEX="1", PYTHONDONTWRITEBYTECODE="1"
    )
    return env


def check(
    args: list[str], cwd: Path, timeout: float = 120, keep_pythonpath: bool = False, **env: str
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        args, cwd=cwd, env=clean_env(keep_pythonpath) | env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def missing_build_backend() -> str | None:
    """Why the project's build backend (setuptools with bdist_wheel) cannot run offline, if it cannot."""
    code = (
        "try:\n"
        "    from setuptools.command.bdist_wheel import bdist_wheel\n"  # setuptools >= 70.1
        "except ImportError:\n"
        "    from wheel.bdist_wheel import bdist_wheel\n"  # older setuptools plus the wheel package
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=clean_env(keep_pythonpath=True),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode == 0:
        return None
    return (
        "building the wheel offline needs setuptools>=70.1 (or the `wheel` package) in the test venv; "
        "add it to the `test` extra in pyproject.toml\n" + result.stderr
    )


def project_setup() -> ModuleType:
    """The project's setup.py as a module (it calls `setup` only when run as a script)."""
    spec = importlib.util.spec_from_file_location("project_setup", REPO / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", params=["compiled", "pure"])
def build(request: pytest.FixtureRequest) -> str:
    """Both builds setup.py makes: compiled (the images') and pure Python (no compiler there)."""
    if request.param == "compiled":
        problem = project_setup().can_compile()
        if problem:
            pytest.skip(f"setup.py cannot compile here: {problem}")
    return str(request.param)


@pytest.fixture(scope="module")
def wheel(build: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel from a copy of the Docker build context (the builder stage's inputs)."""
    problem = missing_build_backend()
    if problem:
        pytest.fail(problem)
    root = tmp_path_factory.mktemp(f"wheel-{build}")
    context = root / "context"
    for rel in context_files():
        target = context / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)
    dist = root / "dist"
    check(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--wheel-dir",
            str(dist),
            str(context),
        ],
        cwd=root,
        timeout=300,
        keep_pythonpath=True,
        STREAM_REPLICATOR_COMPILE="1" if build == "compiled" else "0",
    )
    (built,) = dist.glob("stream_replicator-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean venv with only the wheel installed, and the outer venv's packages reachable."""
    root = tmp_path_factory.mktemp("venv")
    venv = root / "venv"
    check([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root)
    python = venv / "bin" / "python"
    check(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        cwd=root,
        timeout=300,
    )
    purelib = Path(
        check(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root
        ).stdout.strip()
    )
    outer = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "_outer_site_packages.pth").write_text("".join(p + "\n" for p in outer))
    return venv


def test_wheel_metadata(build: str, wheel: Path) -> None:
    if build == "pure":
        assert wheel.name == f"stream_replicator-{VERSION}-py3-none-any.whl"
    else:  # holds compiled code: for this interpreter and platform only
        assert wheel.name.startswith(f"stream_replicator-{VERSION}-cp3") and "none-any" not in wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = zf.read(entry_points).decode()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = zf.read(metadata).decode()
    assert "stream-replicator = replicator.cli.main:main" in text
    assert "stream-replicator-operator = replication_operator.main:main" in text
    assert "Provides-Extra: spark" in meta
    for dependency in PYPROJECT["project"]["dependencies"]:
        assert f"Requires-Dist: {dependency.split('>')[0].split('=')[0]}" in meta


def test_wheel_contents(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert "replication_operator/__init__.py" in names
    assert "replicator/__init__.py" in names and "replicator/py.typed" in names
    assert not any(n.startswith(("operator/", "tests/", "helm/")) for n in names)
    assert not any("__pycache__" in n for n in names)
    # Every source module ships (the package list in pyproject.toml is explicit).
    for package, folder in (("replicator", "replicator"), ("replication_operator", "operator")):
        for source in (REPO / folder).rglob("*.py"):
            if "__pycache__" in source.parts:
                continue
            rel = source.relative_to(REPO / folder).as_posix()
            assert f"{package}/{rel}" in names, f"{folder}/{rel} is not in the wheel"
    # The advisory JSON Schemas, and the fleet-health app the spark image runs from the install.
    for schema in (REPO / "replicator" / "schemas").glob("*.json"):
        assert f"replicator/schemas/{schema.name}" in names
    if (REPO / "replicator" / "fleet_health" / "app.py").exists():
        assert "replicator/fleet_health/app.py" in names


# The `test` extra's distributions by the top-level module each is imported as (a new test extra
# must be named here, so the tests below block it too).
TEST_EXTRA_MODULES = {
    "stream-replicator": None, "pytest": "pytest", "pytest-asyncio": "pytest_asyncio", "pytest-timeout":
    "pytest_timeout", "pytest-xdist": "xdist", "hypothesis": "hypothesis", "kmock": "kmock", "cel-python": "celpy",
    "kubernetes-validate": "kubernetes_validate", "helm-python-sdk": "helm_python", "jsonschema": "jsonschema",
    "ruff": "ruff", "mypy": "mypy", "types-PyYAML": None, "pillow": "PIL", "setuptools": "setuptools",
    "jsonpatch": "jsonpatch", "lupa": "lupa",
}
TEST_ONLY = sorted({m for m in TEST_EXTRA_MODULES.values() if m} | {"tests"})


def test_every_test_extra_is_known() -> None:
    extras = {re.split(r"[<>=\[ ]", d, maxsplit=1)[0] for d in PYPROJECT["project"]["optional-dependencies"]["test"]}
    assert extras <= set(TEST_EXTRA_MODULES), f"name the module of {extras - set(TEST_EXTRA_MODULES)} above"


def test_the_wheel_ships_no_test_harness(wheel: Path) -> None:
    """The API emulator lives in tests/support/ (it was `replication_operator.testing`): no module of the
    wheel is a test module or imports a test extra (jsonpatch is kopf's own dependency, not ours)."""
    with zipfile.ZipFile(wheel) as zf:
        sources = {n: zf.read(n).decode() for n in zf.namelist() if n.endswith(".py")}
    assert not [n for n in sources if n.rsplit("/", 1)[-1] in ("testing.py", "conftest.py", "kube_emulator.py")]
    found = []
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                       else [])
            found += [f"{name} imports {m}" for m in modules if m.split(".")[0] in TEST_ONLY]
    assert not found, found


# Imports every module of the operator with the test extras made unimportable, as on a machine that
# installed the wheel without them.
WITHOUT_TEST_EXTRAS = """
import importlib, importlib.abc, pkgutil, sys
BLOCKED = set(sys.argv[1:])
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is a test extra", name=name)
        return None
sys.meta_path.insert(0, Absent())
import replication_operator
names = [m.name for m in pkgutil.walk_packages(replication_operator.__path__, "replication_operator.")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_the_operator_imports_without_the_test_extras(venv: Path) -> None:
    blocked = [m for m in TEST_ONLY if m != "jsonpatch"]  # kopf imports jsonpatch itself
    out = check([str(venv / "bin" / "python"), "-c", WITHOUT_TEST_EXTRAS, *blocked], cwd=venv).stdout
    assert int(out) >= 40, out  # every module of the operator's sub-packages


def test_hot_modules_are_compiled_in_the_compiled_build_only(build: str, wheel: Path, venv: Path) -> None:
    """The compiled build ships each hot module twice (extension and source); the pure one, source only.
    Installed, the process reports (and logs) which it runs."""
    hot = project_setup().HOT_MODULES
    with zipfile.ZipFile(wheel) as zf:
        extensions = sorted(n for n in zf.namelist() if n.endswith(".so"))
    if build == "pure":
        assert extensions == []
    else:
        for path in hot:
            stem = path.removesuffix(".py")
            assert any(n.startswith(stem + ".") for n in extensions), f"{path} is not compiled in {extensions}"
    code = ("from replicator.service.compiled import compiled_modules, describe; "
            "print(compiled_modules()); print(describe())")
    out = check([str(venv / "bin" / "python"), "-c", code], cwd=venv).stdout.splitlines()
    names = [p.removesuffix(".py").replace("/", ".") for p in hot]
    assert out[0] == str(names if build == "compiled" else [])
    assert out[1].startswith("data path compiled" if build == "compiled" else "data path interpreted")


# Classes that mypyc compiled (they carry `__mypyc_attrs__`) whose bases are not all compiled too: the
# layout of such a class follows whatever the compiler knew of its base, and one built without nats-py
# in sight crashed the garbage collector (RawParser, now kept an ordinary class).
MIXED_CLASSES = """
import importlib, inspect, json
from replicator.service.compiled import HOT_MODULES
mixed = []
for name in HOT_MODULES:
    for cls_name, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass):
        if cls.__module__ == name and hasattr(cls, "__mypyc_attrs__"):
            mixed += [f"{name}.{cls_name}({base.__qualname__})" for base in cls.__mro__[1:]
                      if base is not object and not hasattr(base, "__mypyc_attrs__")]
print(json.dumps(mixed))
"""


def test_no_compiled_class_derives_from_an_interpreted_one(build: str, venv: Path) -> None:
    out = check([str(venv / "bin" / "python"), "-c", MIXED_CLASSES], cwd=venv).stdout
    assert json.loads(out) == []


def test_installed_package_comes_from_the_wheel(venv: Path) -> None:
    code = (
        "import json, replicator, replication_operator, yaml, nats; "
        "print(json.dumps([replicator.__file__, replication_operator.__file__]))"
    )
    files = json.loads(check([str(venv / "bin" / "python"), "-c", code], cwd=venv).stdout)
    for file in files:
        assert Path(file).resolve().is_relative_to(venv.resolve()), f"{file} is not from the wheel"


@pytest.mark.parametrize("script", ["stream-replicator", "stream-replicator-operator"])
def test_console_scripts_run(venv: Path, script: str) -> None:
    path = venv / "bin" / script
    assert path.is_file(), f"the wheel installed no {script} script"
    result = check([str(path), "--help"], cwd=venv)
    assert "usage" in (result.stdout + result.stderr).lower()


def test_one_list_of_compiled_modules() -> None:
    """setup.py compiles, the log reports and the Makefile rebuilds on edits of the same modules."""
    from replicator.service.compiled import HOT_MODULES

    paths = project_setup().HOT_MODULES
    assert [p.removesuffix(".py").replace("/", ".") for p in paths] == list(HOT_MODULES)
    makefile = (REPO / "Makefile").read_text()
    (line,) = [x for x in makefile.splitlines() if x.startswith("COMPILED_SOURCES :=")]
    assert line.split(":=")[1].split() == paths
