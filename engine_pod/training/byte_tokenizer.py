"""A byte-level BPE tokenizer, trained offline on seeded text, with special tokens at chosen ids.

Every random preset is served with one (``dllm_contracts/assets/random-bytes``, written by
``scripts/make_random_tokenizer.py``): byte level, so any text, JSON and tool calls included, has tokens,
and its special tokens sit where the presets' configs put their mask, end-of-text and padding ids. The
same builder makes a tokenizer of a real model's vocabulary size for measuring grammar engines."""

from __future__ import annotations

import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from engine_pod.synthetic.vocabulary import words

BOS, EOS, MASK, PAD = "<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>", "<|pad|>"
USER, ASSISTANT, SYSTEM, TOOL = "<|user|>", "<|assistant|>", "<|system|>", "<|tool|>"
# the tiny presets' ids (mask 1000, end of text 1001; DiffusionGemma's: pad 0, end of turn 1, bos 2)
RANDOM_PRESET_SPECIALS = {
    0: PAD,
    1: "<end_of_turn>",
    2: "<bos>",
    1000: MASK,
    1001: EOS,
    1002: BOS,
    1003: USER,
    1004: ASSISTANT,
    1005: SYSTEM,
    1006: TOOL,
}
RANDOM_PRESET_VOCAB = 1024
# How tools reach a prompt: the template lists them in a system turn (tool calls are asked for in the
# format the grammar of `tool_choice` constrains: <tool_call>{"name": ..., "arguments": {...}}</tool_call>)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|> You may call these tools. To call one, answer "
    '<tool_call>{"name": NAME, "arguments": ARGUMENTS}</tool_call> for each call.\n'
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_KEYS = ["name", "id", "age", "items", "city", "tags", "price", "count", "email", "type", "value", "date"]


def corpus(lines: int, seed: int = 0, extra_words: int = 0) -> list[str]:
    """Seeded training text: JSON documents, tool calls and prose over the shipped vocabulary's words
    (``extra_words``: that many made-up words besides, for a large vocabulary)."""
    rng = random.Random(seed)
    vocabulary = words() + _made_up_words(rng, extra_words)
    makers = (_json_line, _tool_call_line, _prose_line)
    return [makers[i % len(makers)](rng, vocabulary) for i in range(lines)]


def _made_up_words(rng: random.Random, count: int) -> list[str]:
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "ch", "st", "er", "ing"]
    return ["".join(rng.choice(syllables) for _ in range(rng.randint(2, 5))) for _ in range(count)]


def _value(rng: random.Random, vocabulary: list[str], depth: int = 0):
    kind = rng.randrange(7 if depth < 2 else 4)
    if kind == 0:
        return rng.randint(-1000, 100000)
    if kind == 1:
        return round(rng.uniform(-100, 1000), rng.randint(1, 3))
    if kind == 2:
        return " ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 3)))
    if kind == 3:
        return rng.choice([True, False, None])
    if kind in (4, 5):
        return {rng.choice(_KEYS): _value(rng, vocabulary, depth + 1) for _ in range(rng.randint(1, 4))}
    return [_value(rng, vocabulary, depth + 1) for _ in range(rng.randint(0, 4))]


def _json_line(rng: random.Random, vocabulary: list[str]) -> str:
    import json

    keys = rng.sample(_KEYS + rng.sample(vocabulary, 3), rng.randint(1, 6))
    document = {key: _value(rng, vocabulary) for key in keys}
    separators = rng.choice([(",", ":"), (", ", ": ")])
    return json.dumps(document, separators=separators, indent=rng.choice([None, None, 2]))


def _tool_call_line(rng: random.Random, vocabulary: list[str]) -> str:
    import json

    call = {"name": "_".join(rng.sample(vocabulary, 2)), "arguments": _value(rng, vocabulary, 1)}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def _prose_line(rng: random.Random, vocabulary: list[str]) -> str:
    text = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(3, 16)))
    return text[0].upper() + text[1:] + rng.choice([".", "?", "!", ":", ";"])


def build_byte_tokenizer(
    text: list[str], vocab_size: int, specials: dict[int, str]
) -> PreTrainedTokenizerFast:
    """A byte-level BPE over ``text`` of exactly ``vocab_size`` ids: ``specials`` at their ids (the ones
    below the BPE's range first, then the BPE's own tokens, then the ones above it, reserved tokens
    filling any gap between them)."""
    low = sorted(i for i in specials if i < len(specials))
    if low != list(range(len(low))):
        raise ValueError("special tokens below the BPE's range must take the first ids")
    high = sorted(i for i in specials if i >= len(low))
    bpe_end = high[0] if high else vocab_size
    if max(specials, default=0) >= vocab_size:
        raise ValueError(f"a special token's id is past the vocabulary of {vocab_size}")
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_end,
        special_tokens=[specials[i] for i in low],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(text, trainer)
    if core.get_vocab_size() != bpe_end:
        raise ValueError(f"the text gave {core.get_vocab_size()} tokens, not {bpe_end}: give it more text")
    names = [specials.get(i, f"<|reserved_{i}|>") for i in range(bpe_end, vocab_size)]
    core.add_special_tokens(names)
    return _wrapped(core, specials)


def _wrapped(core: Tokenizer, specials: dict[int, str]) -> PreTrainedTokenizerFast:
    named = set(specials.values())
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS if BOS in named else None,
        eos_token=EOS if EOS in named else None,
        pad_token=PAD if PAD in named else None,
        mask_token=MASK if MASK in named else None,
        additional_special_tokens=[t for t in (USER, ASSISTANT, SYSTEM, TOOL) if t in named],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def random_preset_tokenizer() -> PreTrainedTokenizerFast:
    """The random presets' tokenizer (what ``scripts/make_random_tokenizer.py`` writes)."""
    return build_byte_tokenizer(corpus(6000), RANDOM_PRESET_VOCAB, RANDOM_PRESET_SPECIALS)
