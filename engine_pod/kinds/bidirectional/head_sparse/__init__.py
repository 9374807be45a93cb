"""The head-centric sparse dual cache (LLaDA, Dream): each attention head keeps the context positions its
active block attends to most, heads grouped by importance (docs/head_sparse.md)."""
