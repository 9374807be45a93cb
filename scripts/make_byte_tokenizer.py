"""Write a byte-level BPE tokenizer trained offline on seeded text (engine_pod/training/byte_tokenizer.py).

    python scripts/make_byte_tokenizer.py                       # the random presets' (the package's asset)
    python scripts/make_byte_tokenizer.py --llada-8b /tmp/tok   # 126,464 ids, LLaDA-8B's special ids

The second is for measuring grammar engines at a real vocabulary size (scripts/grammar_engines.py);
its training takes about a minute and a half on two cores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dllm_contracts.defaults import ASSETS_DIR  # noqa: E402
from engine_pod.training.byte_tokenizer import (  # noqa: E402
    BOS,
    EOS,
    MASK,
    build_byte_tokenizer,
    corpus,
    random_preset_tokenizer,
)

RANDOM_TOKENIZER = ASSETS_DIR / "random-bytes"
LLADA_8B = {"vocab": 126464, "specials": {126080: BOS, 126081: EOS, 126336: MASK}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llada-8b", type=Path, help="write a tokenizer of LLaDA-8B's vocabulary size here")
    args = parser.parse_args()
    if args.llada_8b is None:
        random_preset_tokenizer().save_pretrained(str(RANDOM_TOKENIZER))
        print(f"wrote {RANDOM_TOKENIZER}")
        return
    text = corpus(400_000, seed=1, extra_words=200_000)
    build_byte_tokenizer(text, LLADA_8B["vocab"], LLADA_8B["specials"]).save_pretrained(str(args.llada_8b))
    print(f"wrote {args.llada_8b}")


if __name__ == "__main__":
    main()
