"""The word-level vocabulary of the shipped model: numbers, letters, names and task words."""

from __future__ import annotations

BOS = "<|startoftext|>"
EOS = "<|endoftext|>"
MASK = "<|mdm_mask|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
UNK = "<unk>"
SPECIAL_TOKENS = [UNK, BOS, EOS, MASK, USER, ASSISTANT]

NAMES = [
    "alice",
    "bob",
    "carol",
    "dave",
    "erin",
    "frank",
    "grace",
    "heidi",
    "ivan",
    "judy",
    "ken",
    "laura",
    "mike",
    "nina",
    "oscar",
    "peggy",
    "quinn",
    "rose",
    "sam",
    "tina",
    "uma",
    "victor",
    "wendy",
    "xena",
    "yuri",
    "zack",
    "amy",
    "ben",
    "cleo",
    "dan",
    "eve",
    "finn",
    "gus",
    "hana",
    "ida",
    "jack",
    "kim",
    "leo",
    "mia",
    "ned",
    "olga",
    "pia",
    "ray",
    "sue",
    "tom",
    "una",
    "val",
    "walt",
    "yara",
    "zoe",
    "abe",
    "bea",
    "cal",
    "dee",
    "eli",
    "fay",
    "gil",
    "hal",
    "ira",
    "joy",
    "kai",
    "lou",
    "max",
    "noa",
    "ola",
    "pat",
    "rex",
    "sky",
    "ted",
    "uri",
    "vic",
    "wes",
]
FRUITS = [
    "apple",
    "pear",
    "kiwi",
    "plum",
    "fig",
    "lime",
    "lemon",
    "mango",
    "peach",
    "grape",
    "melon",
    "cherry",
    "berry",
    "olive",
    "date",
]
COLORS = [
    "red",
    "blue",
    "green",
    "black",
    "white",
    "pink",
    "gray",
    "brown",
    "gold",
    "silver",
    "purple",
    "orange",
]
ANIMALS = ["cat", "dog", "cow", "pig", "hen", "fox", "owl", "bee", "ant", "bat", "elk", "yak", "eel", "emu"]
TASK_WORDS = [
    "count",
    "from",
    "to",
    "by",
    "down",
    "records",
    "is",
    "what",
    "the",
    "value",
    "of",
    "letters",
    "copy",
    "last",
    "word",
    "largest",
    "number",
    "in",
    "list",
    "repeat",
    "times",
    "of",
    "first",
    "and",
    "which",
    "up",
]
PUNCTUATION = list(",.:?;=()")
NUMBER_RANGE = 128  # task numbers are 0..127, one token each
NUMBERS = [str(n) for n in range(NUMBER_RANGE)]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]


def words() -> list[str]:
    """Every ordinary token, in a fixed order (ids follow the special tokens)."""
    seen: dict[str, None] = {}
    for group in (NUMBERS, LETTERS, NAMES, FRUITS, COLORS, ANIMALS, TASK_WORDS, PUNCTUATION):
        for word in group:
            seen.setdefault(word, None)
    return list(seen)
