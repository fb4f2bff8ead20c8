# Everything runs from a local .venv that `make` creates and fills; nothing is needed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all venv test system-test demo bench lint clean image image-base image-test crd manifests

all: test

# The modules setup.py compiles (its HOT_MODULES): an installed build of an older copy of one of them
# would shadow the edited source, so editing one reinstalls (and recompiles).
COMPILED_SOURCES := replicator/transport/wire.py replicator/sampling/limiter.py replicator/copier/admission.py replicator/sampling/state/table.py replicator/sampling/body.py replicator/sampling/keys.py replicator/copier/transform.py replicator/copier/window.py replicator/copier/headers.py replicator/transport/subjects.py

$(STAMP): pyproject.toml setup.py $(COMPILED_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,spark,report]'
	touch $(STAMP)

venv: $(STAMP)

# Test processes: most tests wait on real servers rather than compute, so three share two cores well.
TEST_WORKERS ?= 3

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist load --maxschedchunk 2 --durations=25

# The product installed from its chart and watched by a real Prometheus (tests/system/, docs/what-the-chart-watches.md):
# the operator, its workers and Prometheus as processes, over the API emulator. `make test` skips them.
system-test: $(STAMP)
	STREAM_REPLICATOR_SYSTEM_TESTS=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile tests/system

demo: $(STAMP)
	$(BIN)/stream-replicator demo

bench: $(STAMP)
	$(BIN)/python -m bench

# Container images (docs/images.md): docker when its engine works, else buildah. PYTHON_IMAGE picks
# the base (default: python:3.11-slim-bookworm if it can be pulled, else the Debian stand-in that
# `make image-base` bootstraps); IMAGE_TOOL=docker|buildah forces a tool.
IMAGE_ARGS = $(if $(PYTHON_IMAGE),--base $(PYTHON_IMAGE)) $(if $(IMAGE_TOOL),--tool $(IMAGE_TOOL))

image:
	$(PYTHON) images/build.py $(IMAGE_ARGS)

image-base:
	images/bootstrap-base

# Builds both images with buildah (the tests run them with podman), then runs them (tests/images).
image-test: $(STAMP)
	$(PYTHON) images/build.py --tool buildah $(if $(PYTHON_IMAGE),--base $(PYTHON_IMAGE))
	$(BIN)/python -m pytest -q --images tests/images

# The StreamReplication CRD is generated from the operator's typed models (operator/model/): edit those,
# then regenerate both copies; tests/operator/test_operator_crd.py fails while either differs.
CRD_FILES := crds/streamreplications.streamreplicator.io.yaml helm/stream-replicator/crds/streamreplications.streamreplicator.io.yaml \
	crds/natsconnections.streamreplicator.io.yaml helm/stream-replicator/crds/natsconnections.streamreplicator.io.yaml

crd: $(STAMP)
	$(BIN)/python -m replication_operator.model.crd $(CRD_FILES)

# Plain manifests for installing without Helm (docs/operator.md), rendered from the chart into deploy/;
# tests/helm/test_manifests.py fails while they differ from what the chart renders.
manifests: $(STAMP)
	$(BIN)/python helm/generate_manifests.py deploy

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy replicator operator

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find replicator -name "*.so" -delete  # the editable install's compiled modules (setup.py)
