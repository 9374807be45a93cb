"""Writes the block-diffusion models shipped with the package: a LLaDA2.0 and an SDAR of random weights
(nothing trained: their answers are random words) with the shipped model's tokenizer and chat template,
so that ``dllm serve --model builtin:tiny-llada2-random`` (or ``builtin:tiny-sdar-random``) serves the
block-diffusion path out of the box.

    python scripts/make_builtin_block_models.py            # rewrites dllm_contracts/assets/tiny-*-random
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

from dllm_contracts.defaults import ASSETS_DIR

logger = logging.getLogger("make_builtin_block_models")
TOKENIZER_SOURCE = ASSETS_DIR / "tiny-llada"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
SPECIAL = {"vocab_size": 320, "mask_token_id": 3, "eos_token_id": 2, "pad_token_id": 2}  # the tokenizer's
SHAPE = {  # both models: 2 layers of width 64, 4 query heads and 2 KV heads of width 16
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}
MODELS = {
    "tiny-llada2-random": {  # a dense layer, then a mixture of 4 experts in 2 groups, and a shared one
        "architectures": ["LLaDA2MoeModelLM"],
        "model_type": "llada2_moe",
        "use_bias": False,
        "rope_theta": 600000,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
        "n_group": 2,
        "topk_group": 1,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
    },
    "tiny-sdar-random": {
        "architectures": ["SDARForCausalLM"],
        "model_type": "sdar",
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
}


def write(name: str, out: Path, seed: int = 0) -> Path:
    import torch  # here: --help answers before torch loads

    from engine_pod.loading.config_readers import config_from_dict
    from engine_pod.loading.loader import build_model
    from engine_pod.loading.sharded import draw_random
    from engine_pod.loading.weights import save_checkpoint

    raw = {**MODELS[name], **SHAPE, **SPECIAL}
    config = config_from_dict(raw)
    model = build_model(config, torch.device("cpu"), torch.float32)
    draw_random(model, config, seed)
    directory = out / name
    directory.mkdir(parents=True, exist_ok=True)
    save_checkpoint(config, model.state_dict(), directory)
    (directory / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    for file in TOKENIZER_FILES:
        shutil.copy(TOKENIZER_SOURCE / file, directory / file)
    return directory


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ASSETS_DIR, help="folder to write the models into")
    args = parser.parse_args()
    for name in MODELS:
        logger.info("wrote %s", write(name, args.out))


if __name__ == "__main__":
    main()
