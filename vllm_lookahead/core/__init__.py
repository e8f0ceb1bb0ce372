"""Pure lookahead algorithm (numpy, plus numba kernels loaded when a drafter starts; no vLLM, Kafka or
OTel imports): configuration, output memory, acceptance table and the drafter."""

from .config import LookaheadConfig, LookaheadConfigError
from .drafter import LookaheadDrafter, RowStep

__all__ = ["LookaheadConfig", "LookaheadConfigError", "LookaheadDrafter", "RowStep"]
