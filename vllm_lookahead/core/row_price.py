"""The price of a draft row and of drafting at all, measured on the live engine (``DraftRowPrice``), and
the batch-wide cut of draft tokens to a budget (``threshold_allocate``)."""

from __future__ import annotations

import numpy as np


def threshold_allocate(p_cum: np.ndarray, owner: np.ndarray, batch: int, threshold: float,
                       max_total: int | None = None) -> np.ndarray:
    """Draft tokens per row: every candidate token with ``p_cum >= threshold`` (a prefix of its row's
    draft, as ``p_cum`` does not increase along a draft), at most ``max_total`` in all (the most probable)."""
    if len(p_cum) == 0 or max_total == 0:
        return np.zeros(batch, dtype=np.int64)
    take = np.flatnonzero(p_cum >= threshold)
    if max_total is not None and len(take) > max_total:
        take = take[np.argsort(-p_cum[take], kind="stable")[:max_total]]
    return np.bincount(owner[take], minlength=batch)


MIN_ROWS_SPREAD = 1.0
"""``DraftRowPrice`` prices a bucket only while its query rows change from step to step by at least this much
(standard deviation of the change): a row's cost is the slope of step time against rows, which steps of
one size cannot show."""


BORROW_EVERY = 8
"""A bucket without a row cost of its own (fewer than ``min_steps`` steps, or rows that do not vary) is
priced every this many of its steps from its own tokens/s and the row cost of the nearest bucket that has one."""


def _median(a: np.ndarray) -> float:
    """The (upper) median, by one partition: np.median's overhead is most of its time on ~256 values."""
    k = len(a) // 2
    return float(np.partition(a, k)[k])


def batch_bucket(rows: int) -> int:
    """The batch-size bucket of a step with ``rows`` running requests: the next power of two (1, 2, 4, 8,
    16, 32, ...), so that 5-8 requests share one estimate -- the tail of a batch of 8 is the same regime."""
    return 1 << (max(rows, 1) - 1).bit_length()


class DraftRowPrice:
    """The commit probability a draft token must beat to pay for its row, measured per batch-size bucket.

    Why: a draft token adds one query row to the step.  Over a run, tokens/s = tokens / time, and one more
    row with commit probability p raises it iff  p > (step time one row adds) x (tokens/s)  -- the
    row's *price*.  Both factors depend on the hardware, the model, the prompts and the batch (on a CPU a
    draft row costs a measurable share of a step while tokens/s grows with the batch; on a memory-bound
    GPU a row is nearly free), so the engine measures them per bucket, over its last ``window`` pure decode
    steps: the cost of a row is the slope of step time against query rows, fitted on consecutive steps'
    differences (``_refit`` says why), and tokens/s is the same steps' committed tokens over their time.
    ``price(rows)`` is None until a bucket has ``min_steps`` steps whose rows vary from step to step
    (``MIN_ROWS_SPREAD``) -- unless another bucket has a row cost: then, from ``BORROW_EVERY`` steps on, the
    bucket is priced with that row cost (the nearest bucket's) and its own tokens/s.  Why: a row's cost
    is a property of the model and the machine much more than of the batch, while tokens/s is what grows
    with it; a batch that drains (the tail of a burst of requests) passes through its smaller buckets in
    too few steps for their own fits, and the configured floors can be far below a large model's price.
    The configured floors serve while no bucket has a row cost."""

    def __init__(self, window: int = 256, min_steps: int = 32, refit_every: int = 32) -> None:
        self.window = window
        self.min_steps = min_steps
        self.refit_every = refit_every
        # bucket -> ring buffer of its latest steps, one per row: query rows, drafted (0/1), tokens, seconds;
        # steps written in all, steps since the last fit
        self._steps: dict[int, np.ndarray] = {}
        self._written: dict[int, int] = {}
        self._since_fit: dict[int, int] = {}
        self._idle_s: dict[int, float] = {}  # a gap longer than this is idle time (4x the median step)
        self._fit: dict[int, tuple[float, float]] = {}  # bucket -> (seconds per row, tokens/s)
        self._price: dict[int, float] = {}
        # bucket -> the price of drafting at all in a step (the step-time jump from no drafts to drafts, x
        # tokens/s): kept from the last fit that saw both kinds of step (a bucket that stopped drafting
        # sees none)
        self._switch: dict[int, float] = {}
        self.version = 0  # bumped whenever a price changes (callers cache floors by it)

    def observe(self, rows: int, drafts: int, tokens: int, seconds: float) -> None:
        """A pure decode step of ``rows`` requests and ``drafts`` draft rows committed ``tokens`` in ``seconds``.
        (On every engine step: a few scalar writes; the fit runs every ``refit_every`` steps.)"""
        if rows <= 0 or tokens <= 0 or seconds <= 0:
            return
        bucket = batch_bucket(rows)
        buf = self._steps.get(bucket)
        if buf is None:
            buf = self._steps[bucket] = np.zeros((self.window, 4))
            self._written[bucket] = self._since_fit[bucket] = 0
        if seconds > self._idle_s.get(bucket, float("inf")):
            return  # the engine sat idle between two calls (or the machine stalled): not a step time
        written = self._written[bucket]
        buf[written % self.window] = (rows + drafts, 1.0 if drafts else 0.0, tokens, seconds)
        self._written[bucket] = written + 1
        self._since_fit[bucket] += 1
        if written + 1 >= self.min_steps and (bucket not in self._fit or self._since_fit[bucket] >= self.refit_every):
            self._since_fit[bucket] = 0
            self._refit(bucket)
        elif self._row_s(bucket) is None and (written + 1) % BORROW_EVERY == 0:
            self._set_price(bucket, self._borrowed_price(bucket))

    def _refit(self, bucket: int) -> None:
        """Row cost and tokens/s of the bucket's window -- ~0.1 ms, every ``refit_every`` steps.

        The row cost is fitted on *consecutive differences* (step i+1 minus step i: change in step time
        against change in query rows, and in whether the step drafted), by least squares via the normal
        equations, then again without the first fit's outliers.  Why differences: on a shared machine the
        speed drifts (neighbours, frequency) over tens of steps, and the draft rows drift too as the output
        memory fills, so a fit of levels credits the machine's drift to the rows (a fit of levels can price
        the same bucket very differently from run to run); two consecutive steps share the machine's
        state, and their difference cancels it."""
        rows, drafted, tokens, t = self._window(bucket).T
        self._idle_s[bucket] = 4.0 * _median(t)
        tokens_per_s = float(tokens.sum() / t.sum())
        d_rows, d_drafted, d_t = np.diff(rows), np.diff(drafted), np.diff(t)
        price: float | None = None
        row_s = float("nan")
        if float(d_rows.std()) >= MIN_ROWS_SPREAD:
            # steps with and without drafts (which skip vLLM's spec-decode work): that switch has its own term
            both = np.count_nonzero(d_drafted) >= 4
            x = np.stack([d_rows, d_drafted], axis=1) if both else d_rows[:, None]
            keep = np.ones(len(d_t), dtype=bool)
            coef = None
            for _ in range(2):
                xk, tk = x[keep], d_t[keep]
                try:
                    coef = np.linalg.solve(xk.T @ xk, xk.T @ tk)
                except np.linalg.LinAlgError:
                    break
                res = d_t - x @ coef
                keep = np.abs(res - _median(res)) <= 4.0 * 1.4826 * (_median(np.abs(res - _median(res))) + 1e-12)
                if keep.sum() < self.min_steps // 2:
                    break
            if coef is not None:
                row_s = max(float(coef[0]), 0.0)  # a negative slope is noise: rows are then about free
                price = row_s * tokens_per_s
                if both:
                    self._switch[bucket] = max(float(coef[1]), 0.0) * tokens_per_s
        self._fit[bucket] = (row_s, tokens_per_s)
        self._set_price(bucket, price if price is not None else self._borrowed_price(bucket))

    def _row_s(self, bucket: int) -> float | None:
        """The bucket's own fitted row cost (None: no fit, or its rows did not vary)."""
        fit = self._fit.get(bucket)
        return fit[0] if fit is not None and fit[0] == fit[0] else None

    def _window(self, bucket: int) -> np.ndarray:
        """The bucket's latest steps (rows: query rows, drafted, tokens, seconds), oldest first."""
        written = self._written[bucket]
        data = self._steps[bucket][: min(written, self.window)]
        if written > self.window:  # the ring buffer in time order
            data = np.roll(data, -(written % self.window), axis=0)
        return data

    def _donor(self, bucket: int) -> int | None:
        """The nearest other bucket with a row cost of its own (ties: the larger bucket), or None."""
        donors = [b for b in self._fit if b != bucket and self._row_s(b) is not None]
        return min(donors, key=lambda b: (abs(b.bit_length() - bucket.bit_length()), -b)) if donors else None

    def _borrowed_price(self, bucket: int) -> float | None:
        """The donor's row cost (``_donor``) x this bucket's own tokens/s."""
        donor = self._donor(bucket)
        if donor is None:
            return None
        _, _, tokens, t = self._window(bucket).T
        return float(self._row_s(donor) * tokens.sum() / t.sum())  # type: ignore[operator]

    def _set_price(self, bucket: int, price: float | None) -> None:
        if price is None:
            if self._price.pop(bucket, None) is not None:
                self.version += 1
        elif self._price.get(bucket) != price:
            self._price[bucket] = price
            self.version += 1

    def _row_cost_from(self, bucket: int) -> int:
        """The bucket whose row cost prices ``bucket``: its donor while it borrows one, else itself."""
        borrows = self._row_s(bucket) is None and bucket in self._price
        donor = self._donor(bucket) if borrows else None
        return bucket if donor is None else donor

    def price(self, rows: int) -> float | None:
        """The measured price of a draft row in a step of ``rows`` requests (None: not measured yet)."""
        return self._price.get(batch_bucket(rows))

    def switch_price(self, rows: int) -> float:
        """The measured price, in committed tokens, of a step of ``rows`` requests drafting at all rather
        than not (0: not measured).  Why: a step with drafts takes vLLM's speculative path -- spec-decode
        metadata, verification -- which costs a fixed share of the step beyond its draft rows (on CPU at
        T > 0 the position-by-position sampling of ``coupled_verify``); drafts whose expected surplus over
        their rows' price does not cover it slow the step down."""
        return self._switch.get(batch_bucket(rows), 0.0)

    def summary(self) -> dict[str, dict[str, float | None]]:
        out: dict[str, dict[str, float | None]] = {}
        for bucket in sorted(self._steps):
            row_s, tokens_per_s = self._fit.get(bucket, (float("nan"), float("nan")))
            out[str(bucket)] = {"price": self._price.get(bucket),
                                "row_ms": None if row_s != row_s else 1000 * row_s,
                                "tokens_per_s": None if tokens_per_s != tokens_per_s else tokens_per_s,
                                "steps": min(self._written[bucket], self.window),
                                "switch_price": self._switch.get(bucket),
                                "row_cost_from": self._row_cost_from(bucket)}
        return out
