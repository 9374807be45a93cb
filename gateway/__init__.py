"""The FastAPI gateway: OpenAI-style API in front of the Redis queue (never imports torch)."""
