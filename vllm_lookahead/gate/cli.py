"""``vllm-lookahead gate``: baseline vs candidate decoder on an eval set -> PASS/FAIL + report.

Exit codes: 0 PASS, 1 FAIL, 2 usage error (bad spec, missing file, bad policy...).  Everything the
gate needs is validated before the first engine starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from vllm_lookahead.decoders import SPEC_HELP, SpecError, parse_spec
from vllm_lookahead.gate.evalset import DEFAULT_EVAL_SET, EvalSetError, load_eval_set
from vllm_lookahead.gate.policy import DEFAULT_POLICY, PolicyError, load_policy

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / "models" / "demo-code-4l"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="vllm-lookahead gate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=SPEC_HELP + ". Docs: docs/gate.md")
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="model directory (default: %(default)s)")
    ap.add_argument("--eval-set", default=str(DEFAULT_EVAL_SET), help="eval set JSONL (default: bundled stdlib set)")
    ap.add_argument("--baseline", default="none", help="baseline decoder SPEC (default: %(default)s)")
    ap.add_argument("--candidate", default="lookahead:k=4", help="candidate decoder SPEC (default: %(default)s)")
    ap.add_argument("--policy", default=str(DEFAULT_POLICY), help="policy YAML (default: bundled)")
    ap.add_argument("--report", default=None, help="report directory (default: reports/gate-<UTC timestamp>)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="engine dtype for both arms (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="engine seed LLM(seed=...) for T>0 samples (default: 0)")
    ap.add_argument("--max-tokens", type=int, default=48, help="for items without max_tokens (default: 48 tokens)")
    ap.add_argument("--max-model-len", type=int, default=None, help="engine context length in tokens (default: model's)")
    ap.add_argument("--limit", type=int, default=None, help="keep the first N items of each task (quick runs)")
    ap.add_argument("--tasks", default=None, help="comma-separated tasks to keep (default: all)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # stdout carries the verdict table only; vLLM's own logging goes to stderr
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm_lookahead.gate.run import GateInputs, UsageError, run_gate

    try:
        baseline = parse_spec(args.baseline)
        candidate = parse_spec(args.candidate)
        policy = load_policy(args.policy)
        items = load_eval_set(args.eval_set, limit=args.limit,
                              tasks=[t for t in args.tasks.split(",") if t] if args.tasks else None)
        if args.limit is not None and args.limit < 1:
            raise UsageError("--limit must be >= 1")
        if args.max_tokens < 1:
            raise UsageError("--max-tokens must be >= 1")
        model = Path(args.model)
        if not model.is_dir():
            raise UsageError(f"model directory {model} does not exist")
        inp = GateInputs(model, items, Path(args.eval_set).name, baseline, candidate, policy, args.dtype,
                         args.seed, args.max_tokens, args.max_model_len)
        report = Path(args.report) if args.report else Path("reports") / time.strftime("gate-%Y%m%dT%H%M%SZ", time.gmtime())
        from vllm_lookahead.gate.run import preflight

        preflight(inp)
    except (SpecError, PolicyError, EvalSetError, UsageError) as e:
        print(f"vllm-lookahead gate: error: {e}", file=sys.stderr)
        return 2
    print(f"gate: {len(items)} items, baseline {baseline.text!r} vs candidate {candidate.text!r}, "
          f"model {model}, {args.dtype}", file=sys.stderr)
    result, paths = run_gate(inp, report)
    from vllm_lookahead.gate.report import criteria_table

    print(criteria_table(result))
    print(f"\nverdict: {result['verdict']}" + (f" (failed: {', '.join(result['failed'])})" if result["failed"] else ""))
    print(f"report: {paths['html']} (also {paths['markdown'].name}, {paths['json'].name}); "
          f"gate wall time {result['meta']['wall_s']:.1f} s")
    return 0 if result["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
