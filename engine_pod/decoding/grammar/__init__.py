"""Structured outputs in the engine: response grammars compiled for the model's tokenizer (``compiler``),
the commit rule that keeps a row's answer in its grammar (``commit_rule``), a cycle's constrained rows
(``rows``) and their part of a step on the device (``device``)."""
