"""An independent, deliberately naive re-implementation of the reference samplers, for tests.

Written from the semantics in tests/data/reference/README.md, sharing no code with the engine:
one sequence at a time, explicit per-head attention, caches as plain K/V tensors spliced by index.
It runs in float64 so that comparisons with the engine (also in float64) are exact.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file

DT = torch.float64


# the MLP's gate activations, written out
ACTIVATIONS = {
    "silu": lambda g: g * torch.sigmoid(g),
    "gelu": lambda g: 0.5 * g * (1 + torch.erf(g / math.sqrt(2))),
}


class NaiveModel:
    """``parallel``: each layer's attention and MLP both read the layer's input (GPT-J's layout), their
    outputs added to it; otherwise the MLP reads the input plus the attention's output."""

    def __init__(self, model_dir: Path, parallel: bool = False) -> None:
        raw = json.loads((Path(model_dir) / "config.json").read_text())
        self.parallel = parallel
        self.activation = ACTIVATIONS[raw.get("activation_type", raw.get("hidden_act", "silu"))]
        self.w = {k: v.to(DT) for k, v in load_file(str(Path(model_dir) / "model.safetensors")).items()}
        self.dream = raw["model_type"] == "Dream"
        if self.dream:
            self.D, self.layers = raw["hidden_size"], raw["num_hidden_layers"]
            self.H, self.KV = raw["num_attention_heads"], raw["num_key_value_heads"]
        else:
            self.D, self.layers = raw["d_model"], raw["n_layers"]
            self.H, self.KV = raw["n_heads"], raw["n_kv_heads"]
        self.theta, self.eps = raw["rope_theta"], raw["rms_norm_eps"]
        self.mask = raw["mask_token_id"]
        self.hd = self.D // self.H

    _NAMES = {
        True: (
            "model.layers.{}.",
            {
                "q": "self_attn.q_proj",
                "k": "self_attn.k_proj",
                "v": "self_attn.v_proj",
                "o": "self_attn.o_proj",
                "gate": "mlp.gate_proj",
                "up": "mlp.up_proj",
                "down": "mlp.down_proj",
                "n1": "input_layernorm",
                "n2": "post_attention_layernorm",
            },
        ),
        False: (
            "model.transformer.blocks.{}.",
            {
                "q": "q_proj",
                "k": "k_proj",
                "v": "v_proj",
                "o": "attn_out",
                "gate": "ff_proj",
                "up": "up_proj",
                "down": "ff_out",
                "n1": "attn_norm",
                "n2": "ff_norm",
            },
        ),
    }

    def _weight(self, layer: int, name: str, kind: str = "weight") -> torch.Tensor | None:
        prefix, names = self._NAMES[self.dream]
        return self.w.get(prefix.format(layer) + names[name] + "." + kind)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps))

    def _rope(self, x: torch.Tensor, positions: list[int]) -> torch.Tensor:
        """Pair dimension j with j + hd/2 and rotate by position * theta^(-2j/hd), as complex numbers."""
        half = self.hd // 2
        freq = torch.tensor([self.theta ** (-2 * j / self.hd) for j in range(half)], dtype=DT)
        angle = torch.tensor(positions, dtype=DT)[:, None] * freq[None, :]
        rotated = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones_like(angle), angle)
        return torch.cat([rotated.real, rotated.imag], -1)

    def _linear(self, x: torch.Tensor, layer: int, name: str) -> torch.Tensor:
        y = x @ self._weight(layer, name).T
        bias = self._weight(layer, name, "bias")
        return y if bias is None else y + bias

    def forward(self, ids: list[int], positions: list[int], keys_for=None):
        """Logits [T, V] and per-layer (K, V) [heads, T, hd]; ``keys_for(layer, k, v)`` splices a cache."""
        emb = self.w["model.embed_tokens.weight" if self.dream else "model.transformer.wte.weight"]
        x = emb[torch.tensor(ids)]
        kvs = []
        for layer in range(self.layers):
            h = self._norm(x, self._weight(layer, "n1"))
            q = self._linear(h, layer, "q").view(len(ids), self.H, self.hd).transpose(0, 1)
            k = self._linear(h, layer, "k").view(len(ids), self.KV, self.hd).transpose(0, 1)
            v = self._linear(h, layer, "v").view(len(ids), self.KV, self.hd).transpose(0, 1)
            q, k = self._rope(q, positions), self._rope(k, positions)
            kvs.append((k, v))
            keys, values = (k, v) if keys_for is None else keys_for(layer, k, v)
            group = self.H // self.KV
            heads = []
            for head in range(self.H):
                kk, vv = keys[head // group], values[head // group]
                scores = q[head] @ kk.T / math.sqrt(self.hd)
                heads.append(torch.softmax(scores, -1) @ vv)
            attn = torch.cat(heads, -1)
            layer_input, x = x, x + attn @ self._weight(layer, "o").T
            h = self._norm(layer_input if self.parallel else x, self._weight(layer, "n2"))
            gate = h @ self._weight(layer, "gate").T
            x = (
                x
                + (self.activation(gate) * (h @ self._weight(layer, "up").T)) @ self._weight(layer, "down").T
            )
        final = self.w["model.norm.weight" if self.dream else "model.transformer.ln_f.weight"]
        head = self.w["lm_head.weight" if self.dream else "model.transformer.ff_out.weight"]
        return self._norm(x, final) @ head.T, kvs


def _prefix_keys(cache, s):
    return lambda layer, k, v: (
        torch.cat([cache[layer][0][:, :s], k], 1),
        torch.cat([cache[layer][1][:, :s], v], 1),
    )


def _dual_keys(cache, s, e):
    def splice(layer, k, v):
        keys, values = cache[layer][0].clone(), cache[layer][1].clone()
        keys[:, s:e], values[:, s:e] = k, v
        return keys, values

    return splice


def _window_logits(model: NaiveModel, x: list[int], s: int, e: int, cache, mode: str) -> torch.Tensor:
    """Logits of the window (prefix: x[s:], dual: x[s:e]) against the cache."""
    end = len(x) if mode == "prefix" else e
    splice = _prefix_keys(cache, s) if mode == "prefix" else _dual_keys(cache, s, e)
    logits, _ = model.forward(x[s:end], list(range(s, end)), splice)
    return logits


def _shift(logits: torch.Tensor) -> torch.Tensor:
    return torch.cat([logits[:1], logits[:-1]], 0)


def _linear_quota(masks: int, steps: int) -> list[int]:
    base, rem = divmod(masks, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def _commit(x, positions, probs_max, argmax, rule, k=None, threshold=None):
    """Commit at absolute ``positions`` by top-k or threshold rule on given confidences."""
    order = sorted(range(len(positions)), key=lambda i: -float(probs_max[i]))
    if rule == "topk":
        chosen = order[:k]
    else:
        chosen = [i for i in range(len(positions)) if float(probs_max[i]) >= threshold]
        if order and order[0] not in chosen:
            chosen.append(order[0])
    for i in chosen:
        x[positions[i]] = int(argmax[i])


def llada_generate(model, prompt, gen, block, steps, cache, threshold, canvas="full"):
    """``canvas="block"``: the sequence holds the prompt, the committed blocks and the active block only
    (no masked suffix), growing by one block of masks at each block start (the serving default)."""
    x = list(prompt) + ([model.mask] * gen if canvas == "full" else [])
    spb = steps // (gen // block)
    nfe = 0
    for b in range(gen // block):
        if canvas == "block":
            x += [model.mask] * block
        s, e = len(prompt) + b * block, len(prompt) + (b + 1) * block
        quota = _linear_quota(sum(1 for t in x[s:e] if t == model.mask), spb)
        step = 0
        kv = None
        while True:
            if cache == "none" or step == 0:
                logits, kv = model.forward(x, list(range(len(x))))
                offset = 0
            else:
                logits = _window_logits(model, x, s, e, kv, cache)
                offset = s
            nfe += 1
            cand = [p for p in range(s, e) if x[p] == model.mask]
            probs = torch.softmax(logits[[p - offset for p in cand]], -1) if cand else None
            if cand:
                rule = "topk" if threshold is None else "thr"
                _commit(
                    x,
                    cand,
                    probs.max(-1).values,
                    probs.argmax(-1),
                    rule,
                    quota[step] if threshold is None else None,
                    threshold,
                )
            step += 1
            done = all(t != model.mask for t in x[s:e])
            if cache == "none" and threshold is None:
                if step == spb:
                    break
            elif done or (cache == "dual" and step == spb):
                break
    return x[len(prompt) :], nfe


def dream_block_generate(model, prompt, gen, block, steps, dual, threshold, eps=1e-3):
    x = list(prompt) + [model.mask] * gen
    spb = steps // (gen // block)
    t = torch.linspace(1, eps, spb + 1, dtype=torch.float32)
    nfe = 0
    for b in range(gen // block):
        s, e = len(prompt) + b * block, len(prompt) + (b + 1) * block
        logits, kv = model.forward(x, list(range(len(x))))
        nfe += 1
        x[s] = int(_shift(logits)[s].argmax())
        i = 1
        while True:
            window = _shift(_window_logits(model, x, s, e, kv, "dual" if dual else "prefix"))
            nfe += 1
            cand = [p for p in range(s, e) if x[p] == model.mask]
            probs = torch.softmax(window[[p - s for p in cand]].float(), -1)
            if threshold is not None:
                _commit(x, cand, probs.max(-1).values, probs.argmax(-1), "thr", threshold=threshold)
            else:
                if i == spb:
                    break
                n = torch.tensor(float(len(cand)), dtype=torch.float32)
                k = int(n * (1 - t[i + 1] / t[i])) if i < spb - 1 else int(n)
                score = (probs * torch.log(probs + 1e-10)).sum(-1)
                _commit(x, cand, score, probs.argmax(-1), "topk", k)
                i += 1
            if all(tok != model.mask for tok in x[s:e]):
                break
    return x[len(prompt) :], nfe


def dream_original_generate(model, prompt, gen, steps, alg, eps=1e-3):
    x = list(prompt) + [model.mask] * gen
    t = torch.linspace(1, eps, steps + 1, dtype=torch.float32)
    for i in range(steps):
        logits = _shift(model.forward(x, list(range(len(x))))[0])
        cand = [p for p in range(len(prompt), len(x)) if x[p] == model.mask]
        probs = torch.softmax(logits[cand].float(), -1)
        if alg == "maskgit_plus":
            score = probs.max(-1).values
        elif alg == "topk_margin":
            top = probs.topk(2, -1).values
            score = top[:, 0] - top[:, 1]
        else:
            score = (probs * torch.log(probs + 1e-10)).sum(-1)
        n = torch.tensor(float(len(cand)), dtype=torch.float32)
        k = int(n * (1 - t[i + 1] / t[i])) if i < steps - 1 else int(n)
        _commit(x, cand, score, probs.argmax(-1), "topk", k)
    return x[len(prompt) :], steps
