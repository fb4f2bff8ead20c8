"""The copy loops (ordered and scaled) and what they share: endpoints, the message transform, provenance."""
