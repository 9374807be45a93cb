"""Arguments shared by several ``dllm`` commands, and the one way they become configs."""

from __future__ import annotations

import argparse

from dllm_contracts.defaults import ASSETS_DIR, DEFAULT_BLOCK_LENGTH, DEFAULT_MODEL_NAME, DEFAULT_THRESHOLD
from dllm_contracts.engine_env import THREADS_ENV
from dllm_contracts.families import FAMILIES, FAMILIES_IN_WORDS
from dllm_contracts.head_sparse_config import HeadSparseConfig
from dllm_contracts.logit_settings import logit_problems
from engine_pod.cli.sparse_args import sparse_config
from engine_pod.decoding.config import CACHE_MODES, REMASKING, DecodingConfig
from engine_pod.loading.presets import PRESETS


class CliError(ValueError):
    """A bad command line: printed as one line, exit status 2."""


def _shipped() -> list[str]:
    return sorted(p.name for p in ASSETS_DIR.iterdir() if (p / "config.json").is_file())


def add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    builtin = ", ".join(f"builtin:{name}" for name in _shipped())
    randoms = ", ".join(f"random:{name}" for name in PRESETS)
    group.add_argument(
        "--model",
        default=DEFAULT_MODEL_NAME,
        help=f"a checkpoint directory or a Hugging Face repo id of any family ({FAMILIES_IN_WORDS}: "
        "GSAI-ML/LLaDA-8B-Instruct, Dream-org/Dream-v0-Instruct-7B, inclusionAI/LLaDA2.0-mini, "
        "JetLM/SDAR-8B-Chat, google/diffusiongemma-26B-A4B-it, ...), a model shipped "
        f"with the package ({builtin}; the *-random ones are untrained), or random weights of a real shape "
        f"({randoms}; served with the shipped tokenizer), or s3://BUCKET/PREFIX in an S3-compatible store "
        "(fetched once into $DLLM_MODEL_CACHE; endpoint from AWS_ENDPOINT_URL, credentials from the AWS "
        f"variables); default: {DEFAULT_MODEL_NAME}. "
        "Weights larger than the device's memory are refused before loading",
    )
    group.add_argument(
        "--family",
        choices=FAMILIES,
        metavar="NAME",
        help=f"the model family the checkpoint must be ({', '.join(FAMILIES)}): a checkpoint of another "
        "family is refused before its weights are read (default: whatever family the checkpoint is; the "
        "operator sets it from a DLLMService's spec.model.family)",
    )
    group.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    group.add_argument(
        "--dtype", default="float32", help="float32, bfloat16, float16 or float64 (default: float32)"
    )
    add_threads_arg(group)


def add_tensor_parallel_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        metavar="N",
        help="split the model across N processes on this machine (N GPUs from --device's index on, or N CPU "
        "processes sharing the threads): attention heads, MLP units and the vocabulary divided among them; "
        "the same tokens as one process (default: 1)",
    )
    parser.add_argument(
        "--expert-parallel",
        type=int,
        default=1,
        metavar="E",
        help="spread a mixture of experts' routed experts (LLaDA2.0, DiffusionGemma) over E sets of the group's "
        "processes, each holding experts / E whole experts (with --tensor-parallel N, E dividing N, each set's "
        "split over its N / E processes); attention and dense layers on each; the same tokens (default: 1)",
    )


def add_group_args(parser: argparse.ArgumentParser) -> None:
    """A tensor-parallel group over several machines (one process per machine, --tensor-parallel counting
    the ranks of all of them): node 0 leads, the others follow it."""
    group = parser.add_argument_group("multi-node group")
    group.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="M",
        help="machines in the group, each running the same share of the --tensor-parallel ranks (default: 1)",
    )
    group.add_argument(
        "--node-rank",
        type=int,
        default=0,
        metavar="K",
        help="this machine's place in the group: 0 leads (claims work and serves), the others follow it "
        "(default: 0)",
    )
    group.add_argument(
        "--group-address", metavar="HOST:PORT", help="where node 0 gathers the group (with --nodes above 1)"
    )


def group_place(args: argparse.Namespace):
    """The group these flags describe (one line for flags that do not fit together)."""
    from engine_pod.parallel.place import GroupPlace

    sizes = (args.tensor_parallel, getattr(args, "nodes", 1), getattr(args, "node_rank", 0))
    try:
        return GroupPlace(*sizes, getattr(args, "group_address", None), getattr(args, "expert_parallel", 1))
    except ValueError as exc:
        raise CliError(str(exc)) from None


def add_threads_arg(parser) -> None:
    """``--threads``: torch's threads in the engine (engine_pod/cpu_threads.py chooses and checks them)."""
    parser.add_argument(
        "--threads",
        metavar="N",
        help=f"torch threads, pinned (default: ${THREADS_ENV}, else one per CPU this process may use that "
        "other processes leave free, at least 1, sampled at start and again between block cycles as the "
        "load changes; the CPUs: its affinity, capped by its cgroup CPU quota; dllm serve keeps one for the "
        "gateway and Redis)",
    )


ON_OFF = {"on": True, "off": False}


def on_off_settings(text: str) -> tuple[bool, ...]:
    """``on``, ``off`` or both (``on,off``: a benchmark runs each policy with and without)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(name not in ON_OFF for name in names) or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"expected on, off or on,off; got {text!r}")
    return tuple(ON_OFF[name] for name in names)


def _one_on_off_setting(text: str) -> tuple[bool, ...]:
    """``on`` or ``off``: a command that runs one way (a benchmark's flag also takes ``on,off``)."""
    if text.strip() not in ON_OFF:
        raise argparse.ArgumentTypeError(f"expected on or off; got {text!r}")
    return (ON_OFF[text.strip()],)


def add_decoding_args(parser: argparse.ArgumentParser, compare: bool = False) -> None:
    """The decoding flags; ``compare`` (a benchmark's): the prefix cache and batch invariance may take
    ``on,off``, every policy run both ways."""
    group = parser.add_argument_group("decoding")
    default = "on" if DecodingConfig.prefix_cache else "off"
    group.add_argument(
        "--prefix-cache",
        type=on_off_settings if compare else _one_on_off_setting,
        default=on_off_settings(default),
        metavar="on|off" + ("|on,off" if compare else ""),
        help="block-diffusion models (LLaDA2.0, SDAR): share the KV cache of whole blocks between requests "
        "that begin alike and keep finished requests' blocks for follow-ups (exact; LLaDA and Dream never "
        "share)" + ("; on,off runs every policy both ways" if compare else "") + f" (default: {default})",
    )
    group.add_argument(
        "--block-length", type=int, default=DEFAULT_BLOCK_LENGTH, help="tokens per block L (default: 32)"
    )
    group.add_argument(
        "--remasking",
        choices=REMASKING,
        default="threshold",
        help="which masked positions to commit at each step (default: threshold). Block-diffusion models "
        "(LLaDA2.0, SDAR) take threshold or scheduled_threshold (their reference rule: every position above "
        "the threshold when they are at least the step's quota, else the quota's most confident) or "
        "low_confidence (the quota alone)",
    )
    group.add_argument(
        "--threshold", type=float, default=DEFAULT_THRESHOLD, help="confidence threshold (default: 0.9)"
    )
    group.add_argument("--cache", choices=CACHE_MODES, default="dual", help="KV cache mode (default: dual)")
    group.add_argument(
        "--canvas",
        choices=("block", "full"),
        default="block",
        help="block: prompt + blocks so far (BlockServe, dllm serve); full: also the masked suffix, as "
        "LLaDA's and Fast-dLLM's reference code (default: block)",
    )
    group.add_argument(
        "--ignore-eos", action="store_true", help="do not stop after a block that contains EOS"
    )
    add_logit_args(group)
    add_batch_invariant_arg(group, compare)


def add_batch_invariant_arg(group, compare: bool = False) -> None:
    """``--batch-invariant [on|off]``: DecodingConfig.batch_invariant (models/batch_invariant.py)."""
    group.add_argument(
        "--batch-invariant",
        nargs="?",
        type=on_off_settings if compare else _one_on_off_setting,
        const=(True,),
        default=(False,),
        metavar="on|off" + ("|on,off" if compare else ""),
        help="a request's outputs (tokens, log probabilities) are the same bits alone and in any batch in "
        "float32 too, whatever kernels the CPU's matrix library picks (with one torch thread: --threads 1): "
        "every linear layer multiplies its rows in tiles of a fixed size, mixture-of-experts groups are padded "
        "alike, every block cycle runs packed, and on a GPU cuBLAS keeps full-precision reductions (no TF32); "
        "costs time, see docs/design.md; alone: on"
        + ("; on,off runs every policy both ways" if compare else "")
        + " (default: off)",
    )


def add_logit_args(group) -> None:
    """The logit budget: how many positions' logits the LM head materializes at once."""
    group.add_argument(
        "--max-materialized-logits",
        type=int,
        metavar="N",
        help="the most positions whose full-vocabulary logits exist at once: the LM head runs in chunks of N "
        "positions, bounding the logits' memory at N x vocabulary entries; the outputs are the same for "
        "every N (default: automatic, about 2^24 entries per chunk, 16 to 1024 positions)",
    )
    group.add_argument(
        "--logit-candidates",
        type=int,
        default=0,
        metavar="K",
        help="score only each position's K likeliest tokens under the LM head in bfloat16: their exact "
        "logits alone are computed, and the proposal, its confidence (a softmax over the K), a sampled draw "
        "and log probabilities are over them; changes outputs; not for DiffusionGemma or --tensor-parallel "
        "above 1 (default: 0, the whole vocabulary)",
    )


LOGIT_FLAGS = {
    "max_materialized_logits": "--max-materialized-logits",
    "logit_candidates": "--logit-candidates",
}


def check_logit_args(args: argparse.Namespace) -> None:
    """Refuse an out-of-range logit budget in one line, before anything starts."""
    problems = logit_problems(args.max_materialized_logits, getattr(args, "logit_candidates", 0))
    if problems:
        raise CliError("; ".join(f"{LOGIT_FLAGS[name]} {text}" for name, text in problems.items()))


def logit_flags(args: argparse.Namespace) -> list[str]:
    """The flags that ask another ``dllm`` command for ``args``'s logit budget."""
    flags = ["--logit-candidates", str(args.logit_candidates)] if args.logit_candidates else []
    if args.max_materialized_logits is None:
        return flags
    return ["--max-materialized-logits", str(args.max_materialized_logits), *flags]


def decoding_config(args: argparse.Namespace, steps_per_block: int) -> DecodingConfig:
    return DecodingConfig(
        block_length=args.block_length,
        steps_per_block=steps_per_block,
        remasking=args.remasking,
        threshold=args.threshold,
        cache=args.cache,
        masked_suffix=args.canvas == "full",
        ignore_eos=args.ignore_eos,
        prefix_cache=args.prefix_cache[0],
        max_materialized_logits=args.max_materialized_logits,
        logit_candidates=getattr(args, "logit_candidates", 0),
        batch_invariant=args.batch_invariant[0],
        sparse=sparse_config(args) if hasattr(args, "sparse_cache") else HeadSparseConfig(),
    )


def parse_int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise CliError(f"{what} must be comma-separated integers, got {text!r}") from exc
    if not values:
        raise CliError(f"{what} is empty")
    return values
