"""The Redis wire protocol shared by the gateway and the engine worker (no torch anywhere here)."""
