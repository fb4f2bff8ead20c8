"""The two engines: which one copies (pure), the native engine's source entry (pure) and its target side (NATS)."""
