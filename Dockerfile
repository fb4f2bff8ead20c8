# stream-replicator images. Two targets from one build (`make image` builds and tags both):
#
#   docker build --target worker -t ghcr.io/stream-replicator/stream-replicator:0.1.0 .        # workers, operator
#   docker build --target spark  -t ghcr.io/stream-replicator/stream-replicator:0.1.0-spark .  # fleet-health job
#
# The Helm chart runs `worker` as the operator (command stream-replicator-operator) and tells the
# operator to use `worker` for replication pods and `spark` (tag "<version>-spark") for fleet health.
#
# Plain Dockerfile syntax only (no heredocs, no RUN --mount, no COPY --chmod): docker (with or
# without BuildKit), buildah/podman and kaniko all build it. The base is a build argument: bookworm,
# which has openjdk-17 (trixie, the newer default of python:3.11-slim, ships Java 21 only). Where the
# registry's base cannot be pulled, images/bootstrap-base makes a stand-in from Debian's packages
# (docs/images.md). Final stages carry no compiler or build tool: only the finished venv is copied.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------------
# deps: a venv with the project's dependencies, read from pyproject.toml alone, so that this layer
# (the slow download) is reused until the dependencies change, whatever happens to the sources.
# No step runs Python with the source tree as its working directory: `python -m` puts the working
# directory first on sys.path, where the project's `operator/` folder would shadow the standard
# library's `operator` module and Python would not even start.
FROM ${PYTHON_IMAGE} AS deps
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /
RUN python3 -m venv /opt/venv
COPY pyproject.toml /src/pyproject.toml
RUN /opt/venv/bin/python -I -c "import tomllib; project = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; print('\n'.join(project['dependencies']))" > /tmp/requirements.txt \
 && /opt/venv/bin/pip install --requirement /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# wheel: the project's wheel, built from exactly what the build context sends (see .dockerignore),
# with the data plane's hot modules compiled by mypyc (setup.py). The C compiler, and Python's
# headers where the base lacks them (a base bootstrapped from Debian's packages), live in this stage
# only; STREAM_REPLICATOR_COMPILE=1 fails the build rather than ship a slower pure-Python worker.
FROM deps AS wheel
RUN apt-get update \
 && apt-get install --yes --no-install-recommends gcc libc6-dev \
      $(test -f "$(/opt/venv/bin/python -I -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" \
        || echo python3-dev) \
 && rm -rf /var/lib/apt/lists/*
COPY setup.py /src/setup.py
COPY README.md /src/README.md
COPY replicator/ /src/replicator/
COPY operator/ /src/operator/
RUN STREAM_REPLICATOR_COMPILE=1 /opt/venv/bin/pip wheel --no-deps --wheel-dir /dist /src

# builder: the worker's venv, the dependencies plus the wheel.
FROM deps AS builder
COPY --from=wheel /dist /dist
RUN /opt/venv/bin/pip install --no-deps /dist/stream_replicator-*.whl \
 && /opt/venv/bin/pip check

# spark-builder: the same venv plus the `spark` extra (PySpark, pyarrow), again from pyproject.toml
# alone before the wheel arrives.
FROM deps AS spark-builder
RUN /opt/venv/bin/python -I -c "import tomllib; project = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; print('\n'.join(project['optional-dependencies']['spark']))" > /tmp/requirements.txt \
 && /opt/venv/bin/pip install --requirement /tmp/requirements.txt \
 && rm /tmp/requirements.txt
COPY --from=wheel /dist /dist
RUN /opt/venv/bin/pip install --no-deps /dist/stream_replicator-*.whl \
 && /opt/venv/bin/pip check

# ---------------------------------------------------------------------------------------------------
# worker: `stream-replicator` (the data plane) and `stream-replicator-operator`.
FROM ${PYTHON_IMAGE} AS worker
LABEL org.opencontainers.image.title="stream-replicator" \
      org.opencontainers.image.description="NATS JetStream stream replicator and its Kubernetes operator" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 replicator \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/replicator \
      --shell /usr/sbin/nologin replicator
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /home/replicator
USER 10001:10001
# Worker /metrics, /healthz, /readyz (the `monitor` port) and the operator's /healthz.
EXPOSE 8080
ENTRYPOINT ["stream-replicator"]
CMD ["--help"]

# ---------------------------------------------------------------------------------------------------
# spark: the fleet-health PySpark job, run by the Spark operator's ScheduledSparkApplication
# (mainApplicationFile: local:///app/replicator/fleet_health/app.py). The entrypoint
# (images/spark-entrypoint) speaks the Spark-on-Kubernetes container protocol (`driver ...`,
# `executor`) and passes anything else through.
FROM ${PYTHON_IMAGE} AS spark
LABEL org.opencontainers.image.title="stream-replicator-spark" \
      org.opencontainers.image.description="stream-replicator fleet-health job on Apache Spark" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install --yes --no-install-recommends openjdk-17-jre-headless procps tini \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /opt/java \
 && groupadd --system --gid 10001 replicator \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/replicator \
      --shell /usr/sbin/nologin replicator
COPY --from=spark-builder /opt/venv /opt/venv
# The app file is the one the wheel installed: /app/replicator is the installed package.
RUN mkdir -p /app \
 && ln -s /opt/venv/lib/python3.11/site-packages/replicator /app/replicator \
 && test -f /app/replicator/fleet_health/app.py
# Executable in the repository (COPY keeps the mode; `COPY --chmod` would need BuildKit in docker).
COPY images/spark-entrypoint /usr/local/bin/spark-entrypoint
ENV PATH=/opt/venv/bin:$PATH \
    JAVA_HOME=/opt/java \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /home/replicator
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/spark-entrypoint"]
CMD ["stream-replicator", "fleet-health", "--help"]
