"""Torch-free scheduling: requests, the pending queue, BlockServe and the static baselines."""
