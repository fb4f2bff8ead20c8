# syntax=docker/dockerfile:1.7
#
# stream-replicator images. Two targets from one build:
#
#   docker build --target worker -t stream-replicator:0.1.0 .        # workers and the operator
#   docker build --target spark  -t stream-replicator:0.1.0-spark .  # the fleet-health Spark job
#
# The Helm chart runs `worker` as the operator (command stream-replicator-operator) and tells the
# operator to use `worker` for replication pods and `spark` (tag "<version>-spark") for fleet health.
#
# The base is pinned to Debian bookworm: it has openjdk-17 (trixie, the newer default of
# python:3.11-slim, ships Java 21 only). Final stages carry no compiler or build tool: the project is
# built into a wheel and installed into /opt/venv in the builder stages, and only that venv is copied.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------------
# builder: the wheel, and a venv with the wheel and its dependencies (pip install, as `make` does).
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY replicator/ replicator/
COPY operator/ operator/
RUN pip wheel --no-deps --wheel-dir /dist . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install /dist/stream_replicator-*.whl

# spark-builder: the same venv plus the `spark` extra (PySpark).
FROM builder AS spark-builder
RUN /opt/venv/bin/pip install "$(ls /dist/stream_replicator-*.whl)[spark]"

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
# (mainApplicationFile: local:///app/replicator/fleet_health/app.py). The entrypoint speaks the
# Spark-on-Kubernetes container protocol (`driver ...`, `executor`) and passes anything else through.
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
COPY --chmod=0755 <<"EOF" /usr/local/bin/spark-entrypoint
#!/bin/bash
# Spark on Kubernetes starts driver pods with `driver <spark-submit args>` and executor pods with
# `executor` plus SPARK_* variables; anything else runs as given.
set -eo pipefail
case "${1:-}" in
  driver)
    shift
    exec /usr/bin/tini -s -- "${SPARK_HOME}/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    java_opts=()
    while IFS= read -r opt; do
      java_opts+=("${opt}")
    done < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
    classpath="${SPARK_CONF_DIR:-${SPARK_HOME}/conf}:${SPARK_HOME}/jars/*"
    if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then
      classpath="${classpath}:${SPARK_EXTRA_CLASSPATH}"
    fi
    exec /usr/bin/tini -s -- "${JAVA_HOME}/bin/java" "${java_opts[@]}" \
      -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${classpath}" org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" \
      --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" \
      --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
  *)
    exec /usr/bin/tini -s -- "$@"
    ;;
esac
EOF
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
