"""``vllm-lookahead demo``: the quick look -- generate on the bundled demo model with and without
lookahead (greedy, float32) and print tokens/s, compression and exact match.  A small preset of
``vllm-lookahead bench``; use that command for the full benchmark."""

from __future__ import annotations

import argparse
import sys

from vllm_lookahead import bench
from vllm_lookahead.decoders import DEFAULT_DECODER


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vllm-lookahead demo", description=__doc__)
    ap.add_argument("--model", default=None, help="HF model directory (default: the bundled demo model)")
    ap.add_argument("--n", type=int, default=16, help="held-out prompts (default 16)")
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args(argv)
    forwarded = ["--n", str(args.n), "--max-tokens", str(args.max_tokens), "--methods", f"none,{DEFAULT_DECODER}",
                 "--batch-sizes", "1", "--prompts", "mixed"]
    if args.model:
        forwarded += ["--model", args.model]
    return bench.main(forwarded)


if __name__ == "__main__":
    sys.exit(main())
