"""Tensor parallelism: a model's layers split across the processes of one group (torch.distributed)."""
