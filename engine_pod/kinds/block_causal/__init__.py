"""The block-causal kind (LLaDA2.0, SDAR): causal across blocks, so a committed block's keys and values
are exact and kept in pages across cycles, and whole blocks are shared through a prefix cache."""
