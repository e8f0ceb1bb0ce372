"""Which T>0 statistic of the gate sees which fault: one gate run per faulty decoder, p-values per test.

Every fault of ``tests.faults`` that touches only sampled outputs, and the exact decoders,
against one baseline arm on a subset of the default eval set, with the default policy's sampling
profiles (or ``--profiles``).  Recorded per decoder: the verdict, every adjusted p-value of the
``sampled`` criterion (excess, PIT, likelihood shift, duplicates, length/stop/pass/flag rates), the
impossible tokens by parameter, and the excess per profile.  One replicate per decoder: a map of what
each statistic sees, not a power estimate (``gate_conformance_power.py`` measures power).

    python benchmarks/gate_fault_matrix.py --json benchmarks/results/gate_fault_matrix.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout first: tests.faults, tests.support (CONTRIBUTING.md)

F = "custom:tests.faults."
DECODERS = ["lookahead:k=8", "ngram:k=4",
            F + "DraftTemperatureProposer:k=4,factor=0.8", F + "LateDraftTemperatureProposer:k=4,factor=0.7",
            F + "IgnoreTruncationProposer:k=4,param=top_p", F + "IgnoreTruncationProposer:k=4,param=top_k",
            F + "RecoveredFromTargetProposer:k=4", F + "ReusedRandomnessProposer:k=4"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model dir (default: the demo model)")
    ap.add_argument("--items-per-task", type=int, default=4, help="eval-set items per task (no unit-test tasks)")
    ap.add_argument("--samples-per-item", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--decoders", default=";".join(DECODERS), help="candidate SPECs, ';'-separated")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)

    from vllm_lookahead.decoders import DEMO_MODEL, parse_spec
    from vllm_lookahead.gate.evalset import DEFAULT_EVAL_SET, load_eval_set
    from vllm_lookahead.gate.policy import load_policy
    from vllm_lookahead.gate.run import (
        GateInputs,
        evaluate,
        preflight,
        run_baseline,
        run_candidate,
        score_samples,
    )

    model = Path(args.model or DEMO_MODEL)
    pol = load_policy()
    pol["criteria"]["sampled"]["samples_per_item"] = args.samples_per_item
    pol["runs"]["latency_items"] = 2
    items = [dataclasses.replace(it, max_tokens=min(it.max_tokens or args.max_tokens, args.max_tokens))
             for it in load_eval_set(DEFAULT_EVAL_SET, limit=args.items_per_task) if it.task != "unit_tests"]

    def inputs(spec: str) -> GateInputs:
        return GateInputs(model, items, "subset", parse_spec("none"), parse_spec(spec), pol,
                          default_max_tokens=args.max_tokens, max_model_len=1024)

    t0 = time.time()
    base_inp = inputs("none")
    clfs = preflight(base_inp)
    base = run_baseline(base_inp)
    specs = [s for s in args.decoders.split(";") if s.strip()]
    cands = {s: run_candidate(inputs(s)) for s in specs}
    score_samples(base_inp, [base.sampled] + [c.sampled for c in cands.values()])
    rows: dict[str, Any] = {}
    for spec, cand in cands.items():
        res = evaluate(inputs(spec), base, cand, clfs, None, 0.0)[0]
        sm = res["sampled"]
        conf = sm["conformance"]
        rows[spec] = {"verdict": res["verdict"], "failed": res["failed"], "p_adjusted": sm["p_adjusted"],
                      "excess_candidate_nats_per_token": conf["excess_candidate"]["nats_per_token"],
                      "impossible_tokens": conf["out_of_support"],
                      "impossible_by_reason": conf["out_of_support_reasons"],
                      "excess_per_profile": conf["profiles"]["candidate"],
                      "duplicate_samples": sm["rates"]["duplicate_samples"],
                      "greedy_mismatches": res["exact_match"]["candidate"]["mismatches"]}
        print(f"{spec:70s} {res['verdict']}  failed={res['failed']}", file=sys.stderr)
    out = {"command": shlex.join(["python", "benchmarks/gate_fault_matrix.py", *(sys.argv[1:] if argv is None else argv)]),
           "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": str(model),
           "items": len(items), "samples_per_item": args.samples_per_item,
           "profiles": pol["criteria"]["sampled"]["profiles"], "alpha": pol["criteria"]["sampled"]["alpha"],
           "wall_s": time.time() - t0, "decoders": rows}
    Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
