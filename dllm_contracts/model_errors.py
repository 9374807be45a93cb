"""The error every model source raises when it cannot give a model (a path, the Hub, an S3 store)."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """The model could not be found or loaded; the message says why in one line."""
