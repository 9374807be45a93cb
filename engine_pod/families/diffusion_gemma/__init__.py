"""DiffusionGemma (``model_type: diffusion_gemma``), the uniform-noise block-diffusion family: a causal
encoder writes the context's keys and values, a bidirectional decoder denoises one canvas of random
tokens over them, canvas after canvas. Text path only; its record names the canvas kind
(``engine_pod/kinds/canvas/``: the stepper, and the kept context's keys and values in pages of a pool,
a page table per request).

config.py (config.json and its defaults), multimodal.py (what is refused or skipped), weights.py
(the checkpoint), model.py with layer.py, attention.py, experts.py, rotary.py and blocks.py (the
forward), generate.py (one request, the plain loop), random_init.py (a random preset's weights),
sampler_settings.py (the per-request settings the family adds: its sampler's). The sampler is
``engine_pod/decoding/entropy_bound.py``.
"""
