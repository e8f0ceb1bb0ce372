"""Pure lookahead algorithm (numpy, plus numba kernels loaded when a drafter starts; no vLLM, Kafka or
OTel imports): configuration, n-gram pool, context index, output memory, per-request Jacobi state and
the batch drafter with its adaptive policy."""

from .config import LookaheadConfig, LookaheadConfigError
from .drafter import LookaheadDrafter, RowStep
from .pool import NGramPool

__all__ = ["LookaheadConfig", "LookaheadConfigError", "LookaheadDrafter", "NGramPool", "RowStep"]
