"""The acceptance table: P(draft token accepted | its predecessors were), learned per evidence bucket and
draft position from the verifications the engine has done.

Why estimates instead of a fixed k: a draft token is worth its row only if it is likely to be committed.
Each candidate token falls in a cell -- its source's evidence bucket (context: how often the matched
suffix occurred and whether it was always followed by the same token, and the match length; memory: the
matched length and the continuation's smoothed frequency), its draft position (1, 2, 3, 4+) and whether
the other source agrees -- whose estimate is Beta-smoothed towards a prior, so it is usable from the first
step.  A candidate's commit probability per token is the product of its cells' estimates times the
request's own accepted/expected history; the drafter drafts while it stays above a floor.  The numbers
here are the compiled kernels' (core/kernels.py) inputs.
"""

from __future__ import annotations

import numpy as np

DEPTHS = 4  # draft positions 1, 2, 3, 4+ have their own cells
# evidence buckets: context (the matched suffix occurred once / more often, always followed by the drafted
# token / more often, followed by different tokens: ``kernels.suffix_match_evidence``) x match length 1..4+;
# memory (matched length 1-2 / 3-5 / 6+) x (smoothed frequency <0.4 / <0.7 / <0.9 / >=0.9)
CTX0, MEM0, BUCKETS = 0, 12, 24
CTX_SINGLE, CTX_UNANIMOUS, CTX_SPLIT = 0, 1, 2  # as core/kernels.py numbers them
_PRIOR_CTX = [0.3, 0.5, 0.6, 0.7] + [0.5, 0.7, 0.8, 0.85] + [0.2, 0.3, 0.35, 0.4]
_PRIOR_MEM_FREQ = [0.3, 0.5, 0.7, 0.85]
_PRIOR = np.array(_PRIOR_CTX + [f for _ in range(3) for f in _PRIOR_MEM_FREQ])
_FREQ_EDGES = (0.4, 0.7, 0.9)
# agreement between the context and the memory candidates, per draft token: the table holds one block of
# BUCKETS x DEPTHS cells per state -- ALONE (the other source has no token there, or diverged earlier),
# AGREE (it drafts the same token after the same prefix), CONFLICT (it drafts a different one).  Why: a
# memory draft's first token is accepted far more often where the context draft has the same token
# there than where it has a different one -- evidence neither source's own counts carry.
ALONE, AGREE, CONFLICT = 0, 1, 2  # as core/kernels.py numbers them
AGREE_STATES = 3
BLOCK = BUCKETS * DEPTHS
_PRIOR_ALL = np.concatenate([_PRIOR, 1.0 - 0.5 * (1.0 - _PRIOR), 0.6 * _PRIOR])
CLASS_CELLS = AGREE_STATES * BLOCK
# sampler classes: the table holds one set of CLASS_CELLS cells per class of the request's temperature --
# greedy, then T in (0, 0.5], (0.5, 0.85], (0.85, 1.15], above.  Why: a greedy draft token is committed when
# it is the target's argmax, a sampled one with the target's (tempered, truncated) probability of it -- lower,
# and lower the hotter the sampler -- so one estimate per cell for both would overrate drafts at T > 0 and
# underrate them at T = 0 wherever the traffic mixes them.  Each class learns from its own verifications;
# its prior is the greedy prior scaled down (the first few dozen verifications of a cell replace it).
TEMPERATURE_EDGES = (1e-5, 0.5, 0.85, 1.15)  # 1e-5: vLLM's greedy threshold (sampling_params._SAMPLING_EPS)
SAMPLER_CLASSES = len(TEMPERATURE_EDGES) + 1
_CLASS_PRIOR_SCALE = (1.0, 0.8, 0.6, 0.45, 0.35)


def sampler_class(temperature: float | None) -> int:
    """The sampler class of a request sampling at ``temperature`` (None: vLLM's default, 1.0)."""
    t = 1.0 if temperature is None else float(temperature)
    return sum(t >= edge for edge in TEMPERATURE_EDGES)


class AcceptanceTable:
    """P(draft token accepted | its predecessors were), per (evidence bucket, draft position).

    The counts and estimates live in numpy arrays (``evaluated``, ``accepted``, ``p_array``: rows of
    ``arrays``) that the compiled step updates in place (``kernels.observe_rows``): a verified draft
    token's cell counts one evaluation, and one acceptance if it was accepted; the estimate is
    (accepted + weight x prior) / (evaluated + weight), and a cell's counts are halved past ``cap``.
    A request's cells are those of its sampler class (``sampler_class``): class c's start at
    ``c x CLASS_CELLS``."""

    def __init__(self, prior_weight: float = 4.0, cap: float = 4096.0) -> None:
        # rows: evaluated, accepted, estimate, prior -- one array, one argument of the compiled batch step
        self.arrays = np.zeros((4, SAMPLER_CLASSES * CLASS_CELLS), dtype=np.float64)
        self.evaluated, self.accepted, self.p_array, self.prior_array = self.arrays
        greedy = np.repeat(_PRIOR_ALL, DEPTHS)
        self.prior_array[:] = np.concatenate([scale * greedy for scale in _CLASS_PRIOR_SCALE])
        self.p_array[:] = self.prior_array  # the estimates for the compiled proposer
        self.weight = prior_weight
        self.cap = cap  # a cell's counts are halved past this, so the table follows a changing workload

    def summary(self) -> dict[str, list[float]]:
        return {"p": [round(x, 3) for x in self.p_array.tolist()],
                "evaluated": [round(x, 1) for x in self.evaluated.tolist()]}
