"""Measure the reference decoders on a prompt set: compression and exact match vs plain greedy.

Library half of ``benchmarks/reference_lade.py`` so other benchmarks (the vLLM ``bench`` command)
can report the HF reference's compression for their own prompts with one call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers import PreTrainedModel

from .decoder import LadeResult, greedy_generate, lade_generate, prompt_lookup_generate


@dataclass(frozen=True)
class LadeConfig:
    window: int
    ngram: int
    pool_size: int

    @classmethod
    def parse(cls, text: str) -> LadeConfig:
        """``"W,N,G"`` -> config, with a clear error for anything else."""
        parts = text.split(",")
        if len(parts) != 3 or not all(p.strip().lstrip("-").isdigit() for p in parts):
            raise ValueError(f"config {text!r}: expected W,N,G as three integers, e.g. 7,4,7")
        w, n, g = (int(p) for p in parts)
        if w < 1 or n < 3 or g < 0:
            raise ValueError(f"config {text!r}: need W >= 1, N >= 3, G >= 0")
        return cls(w, n, g)

    @property
    def label(self) -> str:
        return f"lade W={self.window} N={self.ngram} G={self.pool_size}"


def model_eos(model: PreTrainedModel) -> int | None:
    """The model's end-of-sequence token (the first, where its config lists several)."""
    eos = model.config.eos_token_id
    return eos[0] if isinstance(eos, list) else eos


def lade_results(model: PreTrainedModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, cfg: LadeConfig,
                 *, eos_token_id: int | None = None, progress: Callable[[int], None] | None = None,
                 **options: object) -> list[LadeResult]:
    """The reference LADE decoder (``lade_generate`` at ``cfg``'s W/N/G, with ``options`` such as
    ``prompt_pool``, ``seed``, ``full_match_bonus``) on every prompt, in order.  One loop for this
    module's prompt-set runs and ``benchmarks/lade_oracle.py``'s variants, so both decode alike."""
    out = []
    for p in prompts:
        out.append(lade_generate(model, p, max_new_tokens, window=cfg.window, ngram=cfg.ngram,
                                 pool_size=cfg.pool_size, eos_token_id=eos_token_id, **options))
        if progress is not None:
            progress(1)
    return out


def _summary(method: str, params: dict, results: list[LadeResult], want: list[list[int]], secs: float) -> dict:
    tokens = sum(len(r.tokens) for r in results)
    forwards = sum(r.forwards for r in results)
    steps = [a for r in results for a in r.accepted[1:]]  # decode steps only (prefill always 1)
    rows = [q for r in results for q in r.rows[1:]]
    return {
        "method": method,
        **params,
        "prompts": len(results),
        "tokens": tokens,
        "forwards": forwards,
        "compression": tokens / forwards if forwards else 0.0,
        "compression_mean_per_prompt": sum(r.compression for r in results) / max(len(results), 1),
        "mean_accepted_per_decode_step": sum(steps) / len(steps) if steps else 0.0,
        "mean_query_tokens_per_decode_step": sum(rows) / len(rows) if rows else 0.0,
        "exact_match": sum(r.tokens == w for r, w in zip(results, want, strict=True)) / max(len(results), 1),
        "seconds": secs,
        "tokens_per_second": tokens / secs if secs > 0 else 0.0,
        "per_prompt_compression": [round(r.compression, 4) for r in results],
    }


def run_prompt_set(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    configs: Sequence[LadeConfig],
    lookup_ks: Sequence[int],
    *,
    lookup_ngram: tuple[int, int] = (1, 3),
    eos_token_id: int | None = None,
    prompt_pool: bool = True,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> list[dict]:
    """Greedy, then each LADE config and each prompt-lookup k, on the same prompts; one dict each.

    ``progress(n)`` is called after each finished decode (for a progress bar).
    """
    tick = progress or (lambda n: None)
    t0 = time.perf_counter()
    want = []
    for p in prompts:
        want.append(greedy_generate(model, p, max_new_tokens, eos_token_id))
        tick(1)
    greedy_secs = time.perf_counter() - t0
    greedy_results = [
        LadeResult(w, max(len(w) - 1, 0), [1] * len(w), rows=[len(p)] + [1] * (len(w) - 1))
        for w, p in zip(want, prompts, strict=True)
    ]
    rows = [_summary("greedy", {}, greedy_results, want, greedy_secs)]
    for cfg in configs:
        t0 = time.perf_counter()
        res = lade_results(model, prompts, max_new_tokens, cfg, eos_token_id=eos_token_id, progress=tick,
                           prompt_pool=prompt_pool, seed=seed)
        params = {"W": cfg.window, "N": cfg.ngram, "G": cfg.pool_size, "prompt_pool": prompt_pool}
        rows.append(_summary("lade", params, res, want, time.perf_counter() - t0))
    for k in lookup_ks:
        t0 = time.perf_counter()
        res = []
        for p in prompts:
            res.append(prompt_lookup_generate(
                model, p, max_new_tokens, k=k, ngram_min=lookup_ngram[0], ngram_max=lookup_ngram[1],
                eos_token_id=eos_token_id,
            ))
            tick(1)
        params = {"k": k, "ngram_min": lookup_ngram[0], "ngram_max": lookup_ngram[1]}
        rows.append(_summary("prompt_lookup", params, res, want, time.perf_counter() - t0))
    return rows
