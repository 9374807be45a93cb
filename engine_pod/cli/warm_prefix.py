"""``--warm-prefix`` and ``--warm-prefix-file`` of ``dllm worker`` and ``dllm serve``: fixed prefixes (system
prompts) computed into the block prefix cache at the worker's start and pinned there.

A value is tokenized as the gateway tokenizes what a request sends, with the model's own tokenizer files:
- ``system:TEXT``: a chat whose first message is the system message TEXT. The chat template renders that
  message, then the next turn's header; the warmed tokens are those every such chat's prompt starts with
  (the renderings of the conversation with probe user messages, up to where they first differ).
- ``prompt:TEXT`` or plain ``TEXT``: a /v1/completions prompt that starts with TEXT (special tokens the
  tokenizer adds to a prompt, such as BOS, included). ``prompt:`` is for a text that starts with ``system:``.
A file's whole text is one value, read the same way. Only whole blocks are cached: a prefix's tail past
its last whole block is not.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engine_pod.cli.common import CliError

SYSTEM, PROMPT = "system:", "prompt:"
# user messages the system form is rendered with: the warmed tokens are what their renderings share
PROBE_MESSAGES = ("a", "Z", "1", " x", "\n", ".", "<", "你")


def add_warm_prefix_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--warm-prefix",
        action="append",
        metavar="[system:|prompt:]TEXT",
        help="compute this prefix's whole blocks into the prefix cache at start and pin them there "
        "(repeatable; block-diffusion models only: LLaDA2.0, SDAR). system:TEXT is a chat that starts with "
        "the system message TEXT (as the chat template renders it); TEXT or prompt:TEXT a completion prompt "
        "that starts with TEXT. Pinned tokens come out of the token budget",
    )
    parser.add_argument(
        "--warm-prefix-file",
        action="append",
        metavar="PATH",
        help="as --warm-prefix, the file's whole text one prefix (repeatable)",
    )


def warm_prefix_flags(args: argparse.Namespace) -> list[str]:
    """The flags that hand ``args``' warm prefixes on to a ``dllm worker`` (files by absolute path)."""
    flags = [flag for text in args.warm_prefix or [] for flag in ("--warm-prefix", text)]
    files = [str(Path(path).expanduser().resolve()) for path in args.warm_prefix_file or []]
    return flags + [flag for path in files for flag in ("--warm-prefix-file", path)]


def warm_texts(args: argparse.Namespace) -> list[str]:
    """Every prefix asked for, files read."""
    texts = list(args.warm_prefix or [])
    for path in args.warm_prefix_file or []:
        try:
            texts.append(Path(path).expanduser().read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"--warm-prefix-file {path}: cannot read it ({exc})") from None
    return texts


def check_warm_family(args: argparse.Namespace) -> None:
    """Refuse warm prefixes for a model without an exact prefix cache, in one line, before any weight is
    read (the checkpoint's config names its family)."""
    if not (args.warm_prefix or args.warm_prefix_file):
        return
    from engine_pod.families.registry import family_of
    from engine_pod.loading.loader import load_metadata
    from engine_pod.scheduler.warm_prefixes import warm_prefix_problem

    family = family_of(load_metadata(args.model, args.family)[0])
    problem = warm_prefix_problem(family.display_name, family.kind.name, args.cache, args.prefix_cache[0])
    if problem is not None:
        raise CliError(problem)
    if getattr(args, "policy", "blockserve") not in ("blockserve",):
        raise CliError(f"--warm-prefix needs a policy with a token budget (blockserve), not {args.policy}")


def warm_prefix_ids(args: argparse.Namespace) -> tuple[tuple[int, ...], ...]:
    """The token ids of every prefix asked for, as the gateway would tokenize the requests they start."""
    texts = warm_texts(args)
    if not texts:
        return ()
    from gateway.tokenizer import GatewayTokenizer, TokenizerError

    try:
        tokenizer = GatewayTokenizer(_tokenizer_source(args.model))
        return tuple(tuple(prefix_ids(tokenizer, text)) for text in texts)
    except TokenizerError as exc:
        raise CliError(f"--warm-prefix: {exc}") from None


def prefix_ids(tokenizer, text: str) -> list[int]:
    """The tokens of one ``--warm-prefix`` value (see the module's docstring)."""
    if text.startswith(SYSTEM):
        return system_prefix_ids(tokenizer, text[len(SYSTEM) :])
    return tokenizer.encode(text[len(PROMPT) :] if text.startswith(PROMPT) else text)


def system_prefix_ids(tokenizer, system: str) -> list[int]:
    """The tokens every chat whose first message is the system message ``system`` starts with, as the
    gateway renders a chat (``encode_chat``): what its renderings with each probe user message share."""
    renderings = [
        tokenizer.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": probe}])
        for probe in PROBE_MESSAGES
    ]
    shared = renderings[0]
    for ids in renderings[1:]:
        same = next((i for i, (a, b) in enumerate(zip(shared, ids)) if a != b), min(len(shared), len(ids)))
        shared = shared[:same]
    return shared


def _tokenizer_source(model: str) -> str:
    """What the gateway tokenizer reads for ``model``: its directory (a hub model's local copy), or a
    ``random:`` preset as the gateway names it."""
    if model.startswith("random:"):
        return model
    from dllm_contracts.model_source import resolve_model_dir

    return str(resolve_model_dir(model))
