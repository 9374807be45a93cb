"""Build the shipped model's tokenizer offline (word level) and save it in Hugging Face format."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine_pod.synthetic.vocabulary import ASSISTANT, BOS, EOS, MASK, SPECIAL_TOKENS, UNK, USER, words

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + words())}
    if len(vocab) > vocab_size:
        raise ValueError(f"vocabulary needs {len(vocab)} ids, more than {vocab_size}")
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=EOS,
        mask_token=MASK,
        additional_special_tokens=[USER, ASSISTANT],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: Path) -> None:
    tokenizer.save_pretrained(str(directory))
