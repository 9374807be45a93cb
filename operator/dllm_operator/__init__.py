"""The DLLMService operator: ``kopf run -m dllm_operator`` registers the handlers below."""

from dllm_operator import handlers as handlers  # noqa: F401 (registration by import)
