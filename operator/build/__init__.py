"""Pure builders: a parsed StreamReplication in, Kubernetes objects out; nothing here talks to the API."""
