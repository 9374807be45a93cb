"""Training smoke test (the real 2-hour run is `dllm train`): reproducible, resumable, loadable output."""

from __future__ import annotations

import json
import random
from collections import Counter
from itertools import islice

import pytest

from engine_pod.cli.main import main
from engine_pod.decoding.config import DecodingConfig
from engine_pod.generation import generate_one
from engine_pod.loading.loader import load_model
from engine_pod.prompts import encode_prompt
from engine_pod.synthetic.masked_batches import SAMPLE_KINDS, _sample, encode
from engine_pod.synthetic.tasks import TASKS, Example, eval_set, generate_examples, is_held_out, parse_tasks
from engine_pod.training.tokenizer_build import build_tokenizer
from engine_pod.training.train import TrainConfig, Trainer


def tiny(out_dir, steps: int) -> TrainConfig:
    return TrainConfig(
        out_dir=str(out_dir),
        steps=steps,
        d_model=32,
        n_layers=1,
        n_heads=2,
        mlp_hidden=64,
        examples_per_step=6,
        token_budget=1024,
        warmup=2,
        save_every=2,
        threads=1,
    )


def test_training_is_reproducible_and_resumable(tmp_path):
    straight = Trainer(tiny(tmp_path / "a", 4))
    straight.run()
    interrupted = Trainer(tiny(tmp_path / "b", 4))
    interrupted.train_step()
    interrupted.train_step()
    interrupted.save_state()  # then the process dies
    resumed = Trainer(tiny(tmp_path / "b", 4))
    assert resumed.resume() and resumed.step == 2
    resumed.run()
    assert [round(loss, 6) for _, loss in resumed.history] == [round(loss, 6) for _, loss in straight.history]
    assert (tmp_path / "a" / "loss.png").stat().st_size > 1000


def test_checkpoint_is_in_the_llada_format_and_generates(tmp_path):
    checkpoint = Trainer(tiny(tmp_path, 2)).run()
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["model_type"] == "llada" and config["weight_tying"] is False
    loaded = load_model(str(checkpoint))
    prompt = encode_prompt(loaded.tokenizer, "count from 3 to 5 .", chat=True)
    result = generate_one(loaded, prompt, 32, DecodingConfig())
    assert len(result.token_ids) == 32


def test_tasks_have_exact_answers_varied_lengths_and_a_disjoint_eval_split():
    train = list(islice(generate_examples(0, "train"), 3000))
    assert not any(is_held_out(e) for e in train)
    held = eval_set(10 * len(TASKS))
    assert all(is_held_out(e) for e in held) and Counter(e.task for e in held) == {t: 10 for t in TASKS}
    tokenizer = build_tokenizer(320)
    answers = [len(tokenizer(e.answer)["input_ids"]) for e in train]
    prompts = [len(encode(tokenizer, e).prompt) for e in train]
    assert min(answers) == 1 and max(answers) >= 100
    assert min(prompts) < 12 and max(prompts) > 200
    assert tokenizer.unk_token_id not in {
        t for e in train[:300] for t in tokenizer(e.prompt + " " + e.answer)["input_ids"]
    }


@pytest.mark.parametrize("kind", SAMPLE_KINDS)
def test_prompt_is_never_masked_and_loss_only_on_masked_positions(kind):
    tokenizer = build_tokenizer(320)
    encoded = encode(tokenizer, Example("count", "count from 3 to 40 .", " ".join(map(str, range(3, 41)))))
    for seed in range(20):
        inputs, targets, weights, kept = _sample(
            encoded, random.Random(seed), 32, tokenizer.eos_token_id, tokenizer.mask_token_id, kind
        )
        prompt = len(encoded.prompt)
        assert inputs[:prompt] == encoded.prompt and not any(weights[:prompt])
        assert all(inputs[i] == tokenizer.mask_token_id for i, w in enumerate(weights) if w > 0)
        assert kept % 32 == 0 and len(inputs) == prompt + kept


def test_every_answer_follows_from_its_prompt():
    for example in islice(generate_examples(3, "train"), 400):
        words = example.prompt.split()
        numbers = [int(w) for w in words if w.isdigit()]
        if example.task == "count":
            assert example.answer == " ".join(map(str, range(1, numbers[-1] + 1)))
        elif example.task == "countdown":
            assert example.answer == " ".join(map(str, range(numbers[0], -1, -1)))
        elif example.task == "letters":
            first, last = words[words.index("from") + 1], words[words.index("to") + 1]
            assert example.answer == " ".join(chr(c) for c in range(ord(first), ord(last) + 1))
        else:
            assert example.task == "needle" and numbers == [int(example.answer)]


def test_frontier_samples_reveal_a_clean_prefix_and_mask_the_rest():
    tokenizer = build_tokenizer(320)
    eos, mask = tokenizer.eos_token_id, tokenizer.mask_token_id
    for length in (5, 31, 63):  # 31 and 63 numbers plus EOS fill whole blocks
        answer = " ".join(map(str, range(1, length + 1)))
        encoded = encode(tokenizer, Example("count", f"count to {length} .", answer))
        for seed in range(300):
            inputs, targets, weights, kept = _sample(encoded, random.Random(seed), 32, eos, mask, "frontier")
            generated = inputs[len(encoded.prompt) :]
            visible = next((i for i, token in enumerate(generated) if token == mask), len(generated))
            assert generated[:visible] == targets[len(encoded.prompt) :][:visible]
            assert all(token == mask for token in generated[visible:])
            assert kept % 32 == 0 and len(generated) == kept


def test_task_lists_are_checked():
    assert parse_tasks(None) is None
    assert parse_tasks("count, lookup") == ("count", "lookup")
    with pytest.raises(ValueError, match="needle"):
        parse_tasks("count,bogus")


def test_eval_rejects_an_unknown_task_in_one_line(capsys):
    assert main(["eval", "--tasks", "bogus", "--n", "2"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bogus" in err[0]
