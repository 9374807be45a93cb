"""The canvas kind (DiffusionGemma): an encoder keeps a causal context's keys and values in pages; each
cycle denoises one canvas per row over it."""
