"""``dllm generate``: complete one prompt and print the text (or one JSON object with --json)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from engine_pod.cli.common import (
    CliError,
    add_decoding_args,
    add_model_args,
    add_tensor_parallel_arg,
    check_logit_args,
    decoding_config,
    group_place,
    parse_int_list,
)
from engine_pod.cli.request_args import add_request_args, request_params
from engine_pod.cli.sparse_args import add_sparse_args
from engine_pod.cli.sparse_checks import check_sparse_run
from engine_pod.cpu_load import apply_threads, pin_threads
from engine_pod.decoding.config import steps_per_block_for


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="complete one prompt",
        description="Complete one prompt with block-wise diffusion decoding, on the block canvas that "
        "`dllm serve` and the benchmarks use (the prompt and the blocks so far); `--canvas full` adds the "
        "masked suffix, as LLaDA's and Fast-dLLM's reference code do.",
    )
    add_model_args(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text (needs the model's tokenizer)")
    source.add_argument("--prompt-ids", help="prompt as comma-separated token ids, e.g. 1,2,3")
    parser.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template"
    )
    parser.add_argument("--gen-length", type=int, default=128, help="tokens to generate (default: 128)")
    steps = parser.add_mutually_exclusive_group()
    steps.add_argument(
        "--steps",
        type=int,
        help="denoising steps over all blocks; the block length must divide the gen length (default: gen length)",
    )
    steps.add_argument(
        "--steps-per-block",
        type=int,
        help="denoising steps of each block, any gen length (whole blocks, cut to it, as the API answers); "
        "LLaDA2.0 caps them at the gen length as its reference does",
    )
    add_decoding_args(parser)
    add_sparse_args(parser)
    add_request_args(parser)
    add_tensor_parallel_arg(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    parser.set_defaults(handler=run)


def _prompt_ids(args: argparse.Namespace, loaded) -> list[int]:
    if args.prompt_ids is not None:
        ids = parse_int_list(args.prompt_ids, "--prompt-ids")
        vocab = loaded.config.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise CliError(f"--prompt-ids has ids outside the vocabulary of {vocab}: {bad[:5]}")
        return ids
    from engine_pod.prompts import encode_prompt

    return encode_prompt(loaded.tokenizer, args.prompt, chat=args.chat)


def run(args: argparse.Namespace) -> int:
    check_logit_args(args)
    check_sparse_run(args)  # before any rank starts
    place = group_place(args)  # sizes that make no group: refused before torch loads (seconds)
    if args.steps_per_block is not None:
        if args.steps_per_block < 1 or args.gen_length < 1:
            raise CliError("--steps-per-block and --gen-length must be positive")
        spb = args.steps_per_block
    else:
        steps = args.steps if args.steps is not None else args.gen_length
        spb = steps_per_block_for(args.gen_length, args.block_length, steps)
    decoding = decoding_config(args, spb)
    threads = apply_threads(args.threads, logging.DEBUG)  # a bad count refused before torch loads

    from engine_pod.generation import generate_one  # torch: every flag checked
    from engine_pod.group_processes import ModelArgs, tensor_parallel_group

    per_rank = max(1, threads.threads // place.size)
    model = ModelArgs(args.model, args.device, args.dtype, family=args.family, threads=per_rank)
    if place.size > 1:
        pin_threads(per_rank)
    with tensor_parallel_group(place, model) as loaded:
        params = request_params(args)
        result = generate_one(loaded, _prompt_ids(args, loaded), args.gen_length, decoding, params=params)
        weights_bytes = loaded.weights_bytes  # rank 0's, the most any rank holds
    if args.json:
        payload = {
            "token_ids": result.token_ids,
            "text": result.text,
            "completion_tokens": result.completion_tokens,
            "finish_reason": result.finish_reason,
            "num_forward_passes": result.num_forward_passes,
            "elapsed_s": round(result.elapsed_s, 6),
            "torch_threads": threads.threads,
            "tensor_parallel": args.tensor_parallel,
            "expert_parallel": args.expert_parallel,
            "weights_bytes_per_rank": weights_bytes,
        }
        sys.stdout.write(json.dumps(payload) + "\n")
    else:
        sys.stdout.write(result.text + "\n")
    return 0
