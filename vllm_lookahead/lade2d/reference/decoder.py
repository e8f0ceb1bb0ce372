"""Greedy decoders over a transformers causal LM: plain greedy, full LADE, and plain prompt lookup.

``lade_generate`` is Lookahead Decoding (Fu et al., ICML 2024) as implemented by LADE
(hao-ai-lab/LookaheadDecoding, ``jacobi_greedy_search_multilevel``), greedy only, batch size 1:

1. Prefill runs the prompt followed by level 0 of the window (W+N-3 tokens copied at random from the
   prompt) under a plain causal mask; the argmax at the last prompt token is the first output token and
   the argmax over level 0 becomes level 1.
2. Warm-up (N-3 more steps, no verification): each step runs ``[current] + window`` with LADE's mask,
   every level drops its first column and the argmax over the top level (minus its first column)
   becomes a new level, until the window holds N-1 levels (W-1 tokens in level 0, W in the others).
3. Steady state: each step runs ``[current] + window + candidates`` in ONE forward
   (:mod:`.layout`).  The W diagonal columns of the window plus the new top-level argmax give W new
   n-grams for the pool; the window shifts by exactly one level (LADE's ``ALWAYS_FWD_ONE``); the
   candidates stored under the current token are verified and the longest matching prefix is
   accepted, plus the model's own next token after it.
4. KV cache: after each step only the prefix, the current token and the winning candidate's accepted
   tokens are kept (LADE copies the same rows); the window and the losing candidates are dropped.

Two deliberate, lossless differences from hao-ai-lab's ``lade`` 0.0.2, both switches: the pool is
seeded with the prompt's n-grams and fed every committed n-gram (``prompt_pool``; lade 0.0.2 has no
such pool), and on a full match the model's token after the candidate is committed too
(``full_match_bonus``; LADE's match loop stops at ``gg = N-2`` and drops it).  With both off and
``seed=10`` (LADE's ``random.seed(10)``) this decoder commits, forward for forward, what ``lade``
commits (``benchmarks/lade_oracle.py``, ``tests/lade2d/reference/test_lade_oracle.py``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from transformers import DynamicCache, PreTrainedModel

from vllm_lookahead.lade2d.lade import verify_greedy as _verify
from vllm_lookahead.lade2d.lade_layout import build_step_layout
from vllm_lookahead.lade2d.lade_pool import LadeNGramPool as NGramPool

from .model import cache_len, forward_rows, keep_cache_rows, vocab_size


@dataclass
class LadeResult:
    """What a decode produced and how many forward passes it took.

    ``steps`` counts forward passes after the prefill; ``forwards = steps + 1`` counts the prefill too
    (it produces the first token).  ``compression = len(tokens) / forwards`` -- LADE's "compression
    ratio" and vLLM's "generated tokens per target forward pass"; exactly 1.0 for plain greedy.
    """

    tokens: list[int]
    steps: int
    accepted: list[int] = field(default_factory=list)  # tokens committed per forward, prefill first
    stop_reason: str = "length"  # "eos" or "length"
    rows: list[int] = field(default_factory=list)  # query tokens per forward (the compute spent)

    @property
    def forwards(self) -> int:
        return self.steps + 1 if self.tokens else 0

    @property
    def compression(self) -> float:
        return len(self.tokens) / self.forwards if self.forwards else 0.0

    def as_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "steps": self.steps,
            "forwards": self.forwards,
            "compression": self.compression,
            "accepted": self.accepted,
            "stop_reason": self.stop_reason,
            "rows": self.rows,
        }


class _Output:
    """Commits tokens in order and stops exactly where plain greedy would (EOS included, or length)."""

    def __init__(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        eos_token_id: int | None,
        pool: NGramPool | None,
    ) -> None:
        self.seq = list(prompt)
        self.new: list[int] = []
        self.max_new = max_new_tokens
        self.eos = eos_token_id
        self.pool = pool  # when set, every generated n-gram is added (LADE's POOL_FROM_PROMPT)
        self.accepted: list[int] = []
        self.rows: list[int] = []
        self.stop_reason = "length"
        self.done = max_new_tokens == 0

    def commit(self, tokens: Sequence[int], rows: int) -> None:
        """Commit ``tokens`` (in order, stopping at EOS/length) produced by a forward of ``rows`` queries."""
        self.rows.append(rows)
        count = 0
        for tok in tokens:
            if self.done:
                break
            self.seq.append(int(tok))
            self.new.append(int(tok))
            count += 1
            if self.pool is not None and len(self.seq) >= self.pool.ngram:
                n = self.pool.ngram
                self.pool.add(self.seq[-n], self.seq[-n + 1 :])
            if self.eos is not None and tok == self.eos:
                self.done, self.stop_reason = True, "eos"
            elif len(self.new) >= self.max_new:
                self.done = True
        self.accepted.append(count)

    def result(self) -> LadeResult:
        return LadeResult(
            self.new, max(len(self.accepted) - 1, 0), self.accepted, self.stop_reason, self.rows
        )


def _check_inputs(model: PreTrainedModel, input_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    prompt = [int(t) for t in input_ids]
    if not prompt:
        raise ValueError("input_ids is empty: the decoders need at least one prompt token")
    vocab = vocab_size(model)
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"input_ids has ids outside the vocabulary [0, {vocab}): {bad[:5]}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    return prompt


def _argmax_rows(logits) -> list[int]:
    return logits.argmax(dim=-1).tolist()


def greedy_generate(
    model: PreTrainedModel,
    input_ids: Sequence[int],
    max_new_tokens: int,
    eos_token_id: int | None = None,
) -> list[int]:
    """Plain greedy decoding with a KV cache, one token per forward (the baseline and the oracle)."""
    prompt = _check_inputs(model, input_ids, max_new_tokens)
    out = _Output(prompt, max_new_tokens, eos_token_id, None)
    if out.done:
        return []
    cache = DynamicCache()
    logits = forward_rows(model, cache, prompt)
    out.commit([int(logits[-1].argmax())], len(prompt))
    while not out.done:
        logits = forward_rows(model, cache, [out.seq[-1]])
        out.commit([int(logits[-1].argmax())], 1)
    return out.new


def lade_generate(
    model: PreTrainedModel,
    input_ids: Sequence[int],
    max_new_tokens: int,
    *,
    window: int,
    ngram: int,
    pool_size: int,
    eos_token_id: int | None = None,
    prompt_pool: bool = True,
    seed: int = 0,
    prefill_window: bool = True,
    full_match_bonus: bool = True,
) -> LadeResult:
    """Greedy Lookahead Decoding with window W=``window``, n-gram size N=``ngram``, G=``pool_size``.

    ``prompt_pool`` seeds the pool with every prompt n-gram and adds each generated n-gram (LADE's
    ``POOL_FROM_PROMPT``; on by default here, off by default in LADE).  ``seed`` drives the random
    initial window (LADE copies random prompt tokens), so runs are reproducible.

    ``prefill_window=False`` is the variant vLLM can run (``lade2d.lade.LadeState``): the prefill carries
    the prompt only, and level 0 enters at the first decode step, which therefore verifies nothing and
    costs one more forward than LADE.  Step for step, the vLLM 2D path must commit what this does.

    ``full_match_bonus=False`` reproduces LADE's match loop exactly: when a candidate matches all its
    N-1 tokens, LADE commits those N-1 and drops the model's next token after them (the loop ends at
    ``gg = N-2``).  With ``prompt_pool=False, full_match_bonus=False, seed=10`` this decoder commits,
    step for step, what hao-ai-lab's ``lade==0.0.2`` commits (``benchmarks/lade_oracle.py``).
    """
    if window < 1:
        raise ValueError(f"window (W) must be >= 1, got {window}")
    if ngram < 3:
        raise ValueError(f"ngram (N) must be >= 3 (N=2 leaves no lookahead level), got {ngram}")
    if pool_size < 0:
        raise ValueError(f"pool_size (G) must be >= 0, got {pool_size}")
    prompt = _check_inputs(model, input_ids, max_new_tokens)
    pool = NGramPool(ngram, pool_size)
    if prompt_pool:
        pool.add_ngrams(prompt)
    out = _Output(prompt, max_new_tokens, eos_token_id, pool if prompt_pool else None)
    if out.done:
        return out.result()
    rng = random.Random(seed)

    # 1. prefill: prompt + level 0, plain causal mask; keep only the prompt's KV.
    level0 = [rng.choice(prompt) for _ in range(window + ngram - 3)]
    cache = DynamicCache()
    levels: list[list[int]]
    if prefill_window:
        logits = forward_rows(model, cache, prompt + level0)
        keep_cache_rows(cache, list(range(len(prompt))))
        argmax = _argmax_rows(logits)
        levels = [level0[1:], argmax[len(prompt) :]]
        out.commit([argmax[len(prompt) - 1]], len(prompt) + len(level0))
    else:
        logits = forward_rows(model, cache, prompt)
        levels = [level0]
        out.commit([int(logits[-1].argmax())], len(prompt))

    while not out.done:
        current = out.seq[-1]
        past = cache_len(cache)
        full = len(levels) == ngram - 1
        guesses = pool.candidates(current) if full else []
        layout = build_step_layout(current, past, levels, guesses)
        logits = forward_rows(
            model, cache, layout.tokens, layout.positions, layout.attention_mask(past, model.dtype)
        )
        argmax = _argmax_rows(logits)
        accepted, matched, winner = _verify(argmax[0], guesses, layout.guess_rows, argmax)
        if not full_match_bonus and matched and matched == len(guesses[winner]):
            # LADE: a full match keeps N-2 candidate rows and commits N-1 tokens (no bonus token).
            matched, accepted = matched - 1, accepted[:-1]

        top = [argmax[r] for r in layout.level_rows[-1]]
        if full:  # 3. harvest W n-grams, then shift the window by one level
            pool.add_window(current, levels, top)
            levels = [levels[1][1:]] + [list(lvl) for lvl in levels[2:]] + [top]
        else:  # 2. warm-up: every level loses column 0, a new top level appears
            levels = [lvl[1:] for lvl in levels] + [top[1:]]

        keep = list(range(past + 1))  # prefix + current token
        if matched:
            keep += [past + r for r in layout.guess_rows[winner][:matched]]
        keep_cache_rows(cache, keep)
        out.commit(accepted, len(layout))
    return out.result()


def lookup_draft(seq: Sequence[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """Prompt lookup: the <= k tokens after the earliest earlier occurrence of the longest suffix n-gram.

    Same rule as vLLM's ``ngram`` proposer (longest match in [ngram_min, ngram_max], earliest
    occurrence), written plainly.
    """
    for n in range(min(ngram_max, len(seq) - 1), ngram_min - 1, -1):
        suffix = list(seq[-n:])
        for start in range(len(seq) - n):
            if list(seq[start : start + n]) == suffix:
                return list(seq[start + n : start + n + k])
    return []


def prompt_lookup_generate(
    model: PreTrainedModel,
    input_ids: Sequence[int],
    max_new_tokens: int,
    *,
    k: int,
    ngram_min: int = 1,
    ngram_max: int = 3,
    eos_token_id: int | None = None,
) -> LadeResult:
    """Greedy prompt-lookup decoding: one draft chain of <= k tokens from prompt+output, no Jacobi.

    The baseline LADE is compared against; it uses the same layout, verification and KV handling as
    :func:`lade_generate` with an empty lookahead window.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 1 <= ngram_min <= ngram_max:
        raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
    prompt = _check_inputs(model, input_ids, max_new_tokens)
    out = _Output(prompt, max_new_tokens, eos_token_id, None)
    if out.done:
        return out.result()
    cache = DynamicCache()
    logits = forward_rows(model, cache, prompt)
    out.commit([int(logits[-1].argmax())], len(prompt))
    while not out.done:
        current = out.seq[-1]
        past = cache_len(cache)
        draft = lookup_draft(out.seq, k, ngram_min, ngram_max)
        guesses = [draft] if draft else []
        layout = build_step_layout(current, past, [[]], guesses)
        logits = forward_rows(
            model, cache, layout.tokens, layout.positions, layout.attention_mask(past, model.dtype)
        )
        argmax = _argmax_rows(logits)
        accepted, matched, winner = _verify(argmax[0], guesses, layout.guess_rows, argmax)
        keep = list(range(past + 1))
        if matched:
            keep += [past + r for r in layout.guess_rows[winner][:matched]]
        keep_cache_rows(cache, keep)
        out.commit(accepted, len(layout))
    return out.result()
