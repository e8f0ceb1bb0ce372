"""Prompt-lookup over a request's committed tokens: find the most recent earlier occurrence of the
longest suffix (``max_match`` down to ``min_match`` tokens) and return what followed it.

A compiled backward scan (numba, ``core/kernels.py::longest_suffix_match``) over the request's tokens,
like vLLM's own ``ngram`` proposer, instead of an index.  Why: the earlier design kept a dict per suffix length (n-gram -> latest end position) up
to date with every committed token -- ``levels`` dict writes per token per request, on the proposer's
per-step path at every batch size (at batch 32 on the 2-core CPU ~0.25 ms of a ~12 ms step).  A scan
needs no upkeep (appending the new tokens is all), and its cost -- one compare per earlier token,
extended backwards only where the last token matches -- is a few microseconds for the contexts vLLM
serves here (bounded by ``max_prompt_index_tokens`` of prompt plus the output).
"""

from __future__ import annotations

import numpy as np

from .jit import load_kernels


class ContextIndex:
    """A request's committed tokens: ``tokens`` (a list other code reads) and ``buf[:len(tokens)]``, an
    int32 copy the compiled code reads in place (this scan, the output memory's look-ups)."""

    def __init__(self, min_match: int, max_match: int):
        self.min_match = min_match
        self.max_match = max_match
        self.tokens: list[int] = []
        self.buf = np.zeros(256, dtype=np.int32)

    def extend(self, new_tokens: list[int] | np.ndarray) -> None:
        """Append committed tokens (a list, or a numpy slice of the engine's token row: copied into
        the buffer array to array, converted to Python ints once for ``tokens``)."""
        toks = self.tokens
        start = len(toks)
        if isinstance(new_tokens, np.ndarray):
            toks.extend(new_tokens.tolist())
        else:
            toks.extend(new_tokens if isinstance(new_tokens, list) else [int(t) for t in new_tokens])
        end = len(toks)
        if end > len(self.buf):  # amortised doubling
            grown = np.zeros(max(end, 2 * len(self.buf)), dtype=np.int32)
            grown[:start] = self.buf[:start]
            self.buf = grown
        self.buf[start:end] = new_tokens if isinstance(new_tokens, np.ndarray) else toks[start:end]

    def lookup(self, max_tokens: int) -> tuple[list[int], int]:
        """(continuation of up to ``max_tokens`` tokens, matched suffix length); ([], 0) if no match."""
        end, length = load_kernels().longest_suffix_match(self.buf, len(self.tokens), self.min_match, self.max_match)
        if end < 0:
            return [], 0
        return self.tokens[end : end + max_tokens], length

    def lookup_evidence(self, max_tokens: int) -> tuple[list[int], int, int]:
        """``lookup`` plus the evidence class of the match (``kernels.suffix_match_evidence``): whether the
        matched suffix occurred once, or more often and always / not always followed by the same token."""
        end, length, evidence = load_kernels().suffix_match_evidence(self.buf, len(self.tokens), self.min_match,
                                                                     self.max_match)
        if end < 0:
            return [], 0, 0
        return self.tokens[end : end + max_tokens], length, evidence
