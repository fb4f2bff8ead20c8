"""The sampling plane: sender keys, the limiter, its state stores, advisories and leader election."""
