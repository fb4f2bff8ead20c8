"""Command-line front ends: one module per command, and the entry point (`main`)."""
