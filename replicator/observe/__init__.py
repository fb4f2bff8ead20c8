"""Observability: Prometheus metrics, the /metrics /healthz /readyz server, logging."""
