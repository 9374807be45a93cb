"""Pure functions from a ServiceSpec to Kubernetes manifests (plain dicts)."""
