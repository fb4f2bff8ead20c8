"""The images the operator runs, by default: the one place that names them.

`make image` tags exactly these references (images/build.py: the repository plus pyproject.toml's
version, `-spark` for the Spark target), and the Helm chart's defaults resolve to the same; the chart
passes its choice in the environment variables below. tests/packaging/test_image_build.py and
tests/helm/test_chart.py keep the three in step.
"""

from __future__ import annotations

REPOSITORY = "ghcr.io/stream-replicator/stream-replicator"
VERSION = "0.1.0"  # pyproject.toml's version
DEFAULT_WORKER_IMAGE = f"{REPOSITORY}:{VERSION}"  # Dockerfile target `worker`
DEFAULT_SPARK_IMAGE = f"{REPOSITORY}:{VERSION}-spark"  # Dockerfile target `spark`

# Set by the Helm chart (values `workerImage`, `sparkImage`); a resource's own `spec.image` and
# `spec.fleetHealth.image` still win for that resource.
WORKER_IMAGE_ENV = "STREAM_REPLICATOR_WORKER_IMAGE"
SPARK_IMAGE_ENV = "STREAM_REPLICATOR_SPARK_IMAGE"
