"""The bidirectional kind (LLaDA, Dream): every position attends to every other, so a cycle's cache is
refreshed at its block's start (Fast-dLLM's dual or prefix cache), optionally head-sparse."""
