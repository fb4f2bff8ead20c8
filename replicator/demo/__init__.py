"""The embedded demo: local NATS servers, a fleet emulator, replication with sampling and fleet health."""
