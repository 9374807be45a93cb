"""DiffusionGemma (``model_type: diffusion_gemma``), the uniform-noise block-diffusion family: a causal
encoder writes the context's keys and values, a bidirectional decoder denoises one canvas of random
tokens over them, canvas after canvas. Text path only; the engine serves it with ``runner/canvas_cycle.py``.

config.py (config.json and its defaults), multimodal.py (what is refused or skipped), weights.py
(the checkpoint), model.py with layer.py, attention.py, experts.py, rotary.py and blocks.py (the
forward), context_cache.py (the kept context: its keys and values in pages of a pool, a page table per
request; a batched forward takes one per row), generate.py (one request, the plain loop), random_init.py
(a random preset's weights). The sampler is ``engine_pod/families/diffusion_gemma/entropy_bound.py``.
"""
