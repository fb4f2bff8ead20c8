"""The operator's own NATS connections, made with a resource's credentials, and what it reads through them."""
