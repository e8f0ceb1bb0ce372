#!/usr/bin/env python3
"""Tokens/s over the best baseline *of the same repeat*, re-read from recorded bench JSONs.

The bench computes this itself since it exists (``vllm_lookahead.bench.add_vs_best_baseline``); this
applies the same function to JSONs recorded before, from their per-repeat ``tokens_per_s_all``.  Why
paired: the repeats run interleaved, so the methods of one repeat share the machine's state, and the
ratio within a repeat cancels drift between repeats that a ratio of two medians keeps.

    python benchmarks/paired_ratios.py benchmarks/results/bench_repeats5_open_64_guard3.json \\
        --json benchmarks/results/paired_ratios_guard3.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", type=Path, help="bench JSONs (vllm-lookahead bench --repeats N --json ...)")
    ap.add_argument("--json", type=Path, help="write the ratios here")
    args = ap.parse_args(argv)
    from vllm_lookahead.bench import add_vs_best_baseline

    out: dict[str, dict] = {}
    for path in args.inputs:
        data = json.loads(path.read_text())
        results = data["results"]
        add_vs_best_baseline(results)
        per = out[str(path)] = {"command": data.get("command"), "code": data.get("code"), "methods": {}}
        for r in results:
            rows = {bs: {k: v for k, v in m.items() if k.startswith("speedup_vs_best_baseline")}
                    for bs, m in r["by_batch_size"].items()}
            if any(rows.values()):
                per["methods"][r["method"]] = rows
                for bs, v in rows.items():
                    if not v:  # no ratio at this batch size (repeats missing)
                        continue
                    print(f"{path.name}  {r['method']:<58} batch {bs:>3}: {v['speedup_vs_best_baseline_median']:.3f}x "
                          f"[{v['speedup_vs_best_baseline_min']:.3f}, {v['speedup_vs_best_baseline_max']:.3f}] "
                          "the best baseline's tokens/s of the same repeat (median [min, max])")
    if args.json:
        args.json.write_text(json.dumps({"command": "python benchmarks/paired_ratios.py " + " ".join(
            argv if argv is not None else sys.argv[1:]), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "inputs": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
