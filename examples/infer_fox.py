#!/usr/bin/env python3
"""Inference with a small FoX language model through foxc on the CPU: a prefill of the prompt,
then a decode loop against a growing KV cache, checked against one run of the whole sequence.

    python3 examples/infer_fox.py [--prompt 48] [--new 16] [--layers 2] [--seed 0] [--evict] [--keep-cumsum]

Every attention call is bench/fox_prefill.attn: N queries at the end of M keys, fused and
pruned on the CPU (the prefill is N = M, a decode step N = 1 against the cache of all earlier
keys). Each layer's cache holds k, v and the forget-gate logits of the past tokens; the program
recomputes the gate cumsum from them (the decay of a key depends only on the gates between it
and the query). The model is random (seeded), NumPy only: embedding, pre-norm blocks (RMSNorm,
attention with a forget gate per head, ReLU MLP), output projection; greedy decoding.

The check at the end runs the whole generated sequence once, without a cache (the same program
with N = M), and compares its logits at every generated position with the decode loop's: they
agree within the pruning bound plus bf16 rounding (the two runs prune different key tiles: a
decode step's query tile is its one row). On the GPU a decode step of this program splits its
keys over blocks (`kernel = split_keys`, docs/GPU_KERNEL.md).

``--keep-cumsum``: each layer's cache keeps the decay cumsum ``c`` instead of the gate logits,
and every call is examples/fox_cache.attn (``c: f32[B, H, M] nonincreasing along M``): a step
appends ``c[t] = c[t - 1] + log f[t]`` for its new tokens and no call rescans the gates.

``--evict``: each layer's cache is a ``foxc.KVCache``, which drops the key blocks no later query
can need (docs/RULES.md, "Eviction"). Its premise is a bound on every query's and key's norm;
here it is proven from the weights: the block's input is RMS-normalized with weight 1, so
``|h| <= sqrt(width)``, and a head's query is ``h`` times that head's columns of ``wqkv``, whose
largest singular value bounds the stretch. The cache checks the bound on every row it passes.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

import foxc

PROGRAM = pathlib.Path(__file__).resolve().parents[1] / "bench" / "fox_prefill.attn"
CUMSUM_PROGRAM = pathlib.Path(__file__).resolve().parent / "fox_cache.attn"


def rmsnorm(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


class Model:
    """Random weights of an `layers`-block FoX LM of width `width` with `heads` heads."""

    def __init__(self, rng, vocab=256, width=64, heads=4, layers=2):
        self.vocab, self.width, self.heads, self.hd = vocab, width, heads, width // heads
        s = 1.0 / np.sqrt(width)
        self.emb = rng.standard_normal((vocab, width)).astype(np.float32)
        self.blocks = []
        for _ in range(layers):
            self.blocks.append(
                {
                    "n1": np.ones(width, np.float32),
                    "wqkv": (rng.standard_normal((width, 3 * width)) * s).astype(np.float32),
                    "wf": (rng.standard_normal((width, heads)) * s).astype(np.float32),
                    # Gate biases spread over heads: some forget within tens of tokens.
                    "bf": np.linspace(-2.0, 5.0, heads).astype(np.float32),
                    "wo": (rng.standard_normal((width, width)) * s).astype(np.float32),
                    "n2": np.ones(width, np.float32),
                    "w1": (rng.standard_normal((width, 4 * width)) * s).astype(np.float32),
                    "w2": (rng.standard_normal((4 * width, width)) * s / 2).astype(np.float32),
                }
            )
        self.nf = np.ones(width, np.float32)
        self.out = (rng.standard_normal((width, vocab)) * s).astype(np.float32)

    def norm_bounds(self, blk):
        """Bounds on every head's |q| and |k| in block `blk`: |h| <= sqrt(width) (RMSNorm with
        weight 1) times the largest singular value of the head's columns of wqkv."""
        h_norm = np.sqrt(self.width) * float(np.abs(blk["n1"]).max())

        def stretch(part):
            cols = blk["wqkv"][:, part * self.width : (part + 1) * self.width].astype(np.float64)
            heads = np.split(cols, self.heads, axis=1)
            return max(np.linalg.norm(w, 2) for w in heads)

        return h_norm * stretch(0), h_norm * stretch(1)

    def heads_first(self, x):
        """[T, width] -> [1, H, T, hd]."""
        t = x.shape[0]
        return np.ascontiguousarray(x.reshape(t, self.heads, self.hd).transpose(1, 0, 2)[None])

    def forward(self, attn, tokens, cache, keep_cumsum=False):
        """Logits [T, vocab] of `tokens` (the next positions), appending their k, v and gate
        logits (or, `keep_cumsum`, the decay cumsum `c` continued from the last key cached) to
        `cache` (one per block) and attending to everything cached."""
        x = self.emb[tokens]
        for blk, c in zip(self.blocks, cache):
            h = rmsnorm(x, blk["n1"])
            q, k, v = np.split(h @ blk["wqkv"], 3, axis=-1)
            f = np.ascontiguousarray((h @ blk["wf"] + blk["bf"]).T[None])  # [1, H, T]
            gate = ("fgate", f)
            if keep_cumsum:
                held = c.tensors if isinstance(c, foxc.KVCache) else c
                last = held["c"][..., -1:].astype(np.float64) if "c" in held else 0.0
                log_f = -np.logaddexp(0.0, -f.astype(np.float64))  # logsigmoid
                gate = ("c", np.ascontiguousarray((last + np.cumsum(log_f, axis=-1)).astype(np.float32)))
            per_key = {"k": self.heads_first(k), "v": self.heads_first(v), gate[0]: gate[1]}
            if isinstance(c, foxc.KVCache):
                # Appends k, v and the gates (or c), attends, evicts what no later query needs.
                o = c(q=self.heads_first(q), **per_key)
            else:
                for name, new in per_key.items():
                    c[name] = new if name not in c else np.concatenate([c[name], new], axis=2)
                o = attn(q=self.heads_first(q), **{n: np.ascontiguousarray(c[n]) for n in per_key})
            o = o[0].transpose(1, 0, 2).reshape(len(tokens), self.width)
            x = x + o @ blk["wo"]
            x = x + np.maximum(rmsnorm(x, blk["n2"]) @ blk["w1"], 0.0) @ blk["w2"]
        return rmsnorm(x, self.nf) @ self.out


def main(prompt=48, new=16, layers=2, seed=0, quiet=False, evict=False, keep_cumsum=False):
    say = (lambda *a: None) if quiet else print
    rng = np.random.default_rng(seed)
    model = Model(rng, layers=layers)
    attn = foxc.load(PROGRAM)
    step = foxc.load(CUMSUM_PROGRAM) if keep_cumsum else attn  # what the decode loop calls
    tokens = list(rng.integers(0, model.vocab, prompt))
    if evict:
        bounds = [model.norm_bounds(blk) for blk in model.blocks]
        cache = [foxc.KVCache(step, max_keys=prompt + new, q_norm=qn, k_norm=kn) for qn, kn in bounds]
    else:
        cache = [dict() for _ in model.blocks]
    t0 = time.perf_counter()
    logits = model.forward(step, np.array(tokens), cache, keep_cumsum)  # prefill: N = M = prompt
    t_prefill = time.perf_counter() - t0
    step_logits = []
    t0 = time.perf_counter()
    for _ in range(new):
        last = logits[-1]
        tokens.append(int(np.argmax(last)))
        step_logits.append(last)
        logits = model.forward(step, np.array(tokens[-1:]), cache, keep_cumsum)  # decode: N = 1
    t_decode = time.perf_counter() - t0
    say(f"prefill {prompt} tokens: {t_prefill * 1e3:.1f} ms; {new} decode steps: {t_decode * 1e3 / new:.1f} ms each")
    say("generated:", tokens[prompt:])
    if evict:
        for i, c in enumerate(cache):
            say(
                f"layer {i}: holds {c.length} of {c.position} keys (dropped {c.dropped}); "
                f"a paged cache would hold per head {c.held_per_head().tolist()}"
            )
    # One run of the whole sequence without a cache, with the gates: its logits at the generated
    # positions.
    whole = model.forward(attn, np.array(tokens[:-1]), [dict() for _ in model.blocks])
    ref = whole[prompt - 1 :]
    got = np.stack(step_logits)
    diff = float(np.abs(got - ref).max())
    scale = float(np.abs(ref).max())
    same = int((got.argmax(-1) == ref.argmax(-1)).sum())
    say(f"decode vs one whole run: max |logit diff| {diff:.2e} (max |logit| {scale:.2f}); greedy tokens agree {same}/{new}")
    return diff, scale, same


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", type=int, default=48)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--evict", action="store_true", help="foxc.KVCache caches that evict (norm bounds from the weights)")
    ap.add_argument("--keep-cumsum", action="store_true", help="caches keep the decay cumsum (examples/fox_cache.attn)")
    a = ap.parse_args()
    main(a.prompt, a.new, a.layers, a.seed, evict=a.evict, keep_cumsum=a.keep_cumsum)
