"""Seeded synthetic tasks with exact answers (tasks.py, over the words of vocabulary.py) and their
masked-diffusion batches (masked_batches.py): what training, evaluation, the benchmark's workloads and head
importance all draw from, importing nothing of theirs."""
