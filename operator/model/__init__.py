"""What a StreamReplication is: its typed spec, the names of what it owns, the default images, and its
status conditions (pure)."""
