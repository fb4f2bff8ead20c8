"""The built images, run (tests/images): only with `--images`, which `make image-test` passes after
building them; without it every test here is skipped, so `make test` stays fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.images.support import Podman, build_module

TAGS = build_module().image_tags()


HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--images"):
        return
    skip = pytest.mark.skip(reason="image tests run with `make image-test` (it builds the images first)")
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def podman() -> Podman:
    found = Podman.find()
    if found is None:
        pytest.skip("podman and runc are needed to run the images (apt-get install podman runc; .ci/run does)")
    return found


def _image(podman: Podman, target: str) -> str:
    tag = TAGS[target]
    if not podman.exists(tag):
        pytest.fail(f"{tag} is not built: run `make image-test` (or `make image IMAGE_TOOL=buildah`) first")
    return tag


@pytest.fixture(scope="session")
def worker_image(podman: Podman) -> str:
    return _image(podman, "worker")


@pytest.fixture(scope="session")
def spark_image(podman: Podman) -> str:
    return _image(podman, "spark")


@pytest.fixture(scope="session")
def built(worker_image: str, spark_image: str) -> dict[str, str]:
    """Both images, checked to exist."""
    return {"worker": worker_image, "spark": spark_image}
