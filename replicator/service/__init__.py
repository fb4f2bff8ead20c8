"""Composition: one running profile (connections, streams, copy loops, sampling plane, monitor)."""
