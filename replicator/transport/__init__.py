"""NATS plumbing: connections (TLS, credentials, reconnects), raw JetStream primitives, stream set-up."""
