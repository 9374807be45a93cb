"""One folder per cache kind: how a family's block cycles keep keys and values (runner/kind.py)."""
