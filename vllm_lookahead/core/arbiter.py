"""Pick the mode (e.g. drafting as configured, or no drafts) that serves more tokens per second, by
measuring each on the live engine: the drafter's busy-batch guard, and any proposer with modes of its
own (the modes are the caller's names).

Why measure: whether draft rows pay depends on the hardware, not the algorithm.  On a memory-bound GPU
step extra rows are nearly free; on a compute-bound CPU each row costs a share of a step.  A fixed rule
would be wrong on one of them, so the engine times its own steps: an EMA of committed
tokens per wall-clock second for each mode, the best one wins, and the others are re-tried for a
few steps every so often so that a change (batch composition, prompt mix) is noticed -- each re-try
measured afresh, not blended into the figure from when the mode last ran.  "off" (no
drafts) is a mode too: at a large batch on a compute-bound device even the chain's rows can cost
more than they return, and then the engine should simply decode.

Re-tries cost: a loser runs at the loser's speed for its steps.  With
``max_explore_every`` above ``explore_every`` the arbiter backs off from a loser that keeps losing by
``decisive`` or more -- each such re-try doubles the wait before its next one, up to
``max_explore_every`` steps; a re-try that comes closer resets it -- and a warm-up whose first
``min_warmup_steps`` steps per mode already separate the modes by ``decisive`` ends there.  A change of
conditions is then noticed within ``max_explore_every`` steps instead of ``explore_every``.
"""

from __future__ import annotations


class ThroughputArbiter:
    """Throughput arbitration between named draft modes for one batch size."""

    def __init__(self, modes: tuple[str, ...] = ("chain", "off"), explore_every: int = 64,
                 explore_steps: int = 4, warmup_steps: int = 8, decay: float = 0.9, outlier: float = 8.0,
                 stale_after: int = 16, max_explore_every: int | None = None, decisive: float = 1.25,
                 min_warmup_steps: int = 4):
        if not modes or len(set(modes)) != len(modes):
            raise ValueError(f"modes must be distinct names, at least one, got {modes}")
        if max_explore_every is not None and max_explore_every < explore_every:
            raise ValueError(f"max_explore_every ({max_explore_every}) must be >= explore_every ({explore_every})")
        if decisive <= 1.0:
            raise ValueError(f"decisive must be > 1 (a ratio of tokens/s), got {decisive}")
        self.modes = tuple(modes)
        self.explore_every = explore_every
        # None: no back-off -- every loser re-tried every explore_every steps, the warm-up always full
        self.max_explore_every = max_explore_every or explore_every
        self.decisive = decisive
        self.min_warmup_steps = min(min_warmup_steps, warmup_steps)
        self.explore_steps = explore_steps
        self.warmup_steps = warmup_steps
        self.decay = decay
        self.outlier = outlier  # a gap this many times the mode's mean step is idle time, not a step
        # a mode whose last step is more than this many steps back is measured afresh when re-tried
        self.stale_after = stale_after
        self.tokens_per_s = {m: 0.0 for m in self.modes}
        self.step_s = {m: 0.0 for m in self.modes}
        self.samples = {m: 0 for m in self.modes}
        self._steps = 0  # steps observed, all modes
        self._last = {m: 0 for m in self.modes}  # the step count at each mode's latest step
        self._fresh = {m: 0 for m in self.modes}  # steps in the mode's current estimate
        self._since_explore = 0
        self._exploring: list[str] = []
        self._next_explore = 0
        self._warm = False  # the warm-up is over (all modes measured warmup_steps times, or decisively)
        self._wait = {m: explore_every for m in self.modes}  # steps before a loser's next re-try
        self._judge: str | None = None  # the mode just re-tried: its fresh estimate decides its next wait

    def observe(self, mode: str, tokens: int, seconds: float) -> None:
        """One engine step ran in ``mode``, committed ``tokens`` over the batch and took ``seconds``."""
        if mode not in self.samples or seconds <= 0 or tokens <= 0:
            return
        if self.samples[mode] >= self.warmup_steps and seconds > self.outlier * self.step_s[mode]:
            return  # the engine sat idle between two generate() calls
        self._steps += 1
        # Why afresh: a loser's estimate was made while it last ran -- the warm-up at the start, when
        # the memory was empty and the requests new -- while the incumbent's follows the conditions
        # step by step; decayed towards by a 2-step re-try, the old figure would decide the
        # comparison.  Within an estimate: the running mean until the EMA's window (1 / (1 - decay)
        # steps) is full, so that its first step does not weigh more than the others.
        if self._steps - self._last[mode] > self.stale_after:
            self._fresh[mode] = 0
        self._last[mode] = self._steps
        self._fresh[mode] += 1
        w = max(1.0 - self.decay, 1.0 / self._fresh[mode])
        self.tokens_per_s[mode] += w * (tokens / seconds - self.tokens_per_s[mode])
        self.step_s[mode] += w * (seconds - self.step_s[mode])
        self.samples[mode] += 1

    def choose(self) -> str:
        """The mode for the next step."""
        # first measure every mode, interleaved (the least-measured first): modes measured one after the
        # other would see different conditions -- a batch that shrinks as requests finish, a warm-up
        # that ends -- and the comparison would credit those to the mode
        if not self._warm:
            warming = [m for m in self.modes if self.samples[m] < self.warmup_steps]
            if warming and not self._decided():
                return min(warming, key=lambda m: self.samples[m])
            self._warm = True
        if self._exploring:
            return self._exploring.pop()
        best = max(self.modes, key=lambda m: self.tokens_per_s[m])
        if self._judge is not None:  # the re-try just done: back off if it lost decisively again
            judged, self._judge = self._judge, None
            if judged != best and self._far_behind(judged, best):
                self._wait[judged] = min(2 * self._wait[judged], self.max_explore_every)
            else:
                self._wait[judged] = self.explore_every
        self._since_explore += 1
        others = [m for m in self.modes if m != best]
        if others and self._since_explore >= self.explore_every:  # re-try one loser that is due, in turn
            due = [m for m in others if self._wait[m] <= self.explore_every or self._steps - self._last[m] >= self._wait[m]]
            if due:
                self._since_explore = 0
                other = due[self._next_explore % len(due)]
                self._next_explore += 1
                self._exploring = [other] * (self.explore_steps - 1)
                self._judge = other
                return other
        return best

    def _decided(self) -> bool:
        """Whether the warm-up may end early: back-off on, every mode measured ``min_warmup_steps``
        times, and the best ahead of every other mode by ``decisive``."""
        if self.max_explore_every <= self.explore_every or min(self.samples.values()) < self.min_warmup_steps:
            return False
        best = max(self.modes, key=lambda m: self.tokens_per_s[m])
        return all(self._far_behind(m, best) for m in self.modes if m != best)

    def _far_behind(self, mode: str, best: str) -> bool:
        """Whether ``best`` serves ``decisive`` times ``mode``'s tokens/s or more (the back-off's test)."""
        return self.tokens_per_s[best] >= self.decisive * self.tokens_per_s[mode]

    def summary(self) -> dict[str, dict[str, float]]:
        return {m: {"tokens_per_s": self.tokens_per_s[m], "step_ms": 1000 * self.step_s[m],
                    "steps": self.samples[m], "retry_every_steps": self._wait[m]} for m in self.modes}
