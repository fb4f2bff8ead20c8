"""Acting on Kubernetes: the reconcile pass, the engine switch and what a pass remembers."""
