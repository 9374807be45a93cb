"""``dllm serve``: Redis, the gateway and one worker on one machine."""
