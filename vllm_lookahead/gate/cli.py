"""``vllm-lookahead gate``: baseline vs candidate on an eval set -> PASS/FAIL + report.

Two modes, the same statistics and report: in-process (``--baseline SPEC --candidate SPEC``: two CPU
engines built here) and endpoint (``--baseline-url URL --candidate-url URL``: two live
OpenAI-compatible vLLM servers, e.g. the stable and the canary Service of a release).

Exit codes: 0 PASS, 1 FAIL (also when the candidate's engine or endpoint dies on requests the baseline
served: the report names the run, sampling profile, requests and error), 2 no verdict (bad spec,
missing file, bad policy, an endpoint down at preflight or answering garbage, the baseline dying, a
crash of the gate itself; no report is written).  Everything the gate needs is validated before the
first request.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from vllm_lookahead.decoders import DEFAULT_DECODER, DEMO_MODEL, SPEC_HELP, SpecError, parse_spec
from vllm_lookahead.gate.evalset import DEFAULT_EVAL_SET, EvalSetError, load_eval_set
from vllm_lookahead.gate.policy import DEFAULT_POLICY, PolicyError, load_policy


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="vllm-lookahead gate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=SPEC_HELP + ". Own eval sets: `vllm-lookahead gate convert --help`. Docs: docs/gate.md")
    ap.add_argument("--model", default=None,
                    help=f"in-process: model directory (default: {DEMO_MODEL}); endpoint mode: the served "
                         "model name (default: each server's first model)")
    ap.add_argument("--eval-set", default=str(DEFAULT_EVAL_SET), help="eval set JSONL (default: bundled stdlib set)")
    ap.add_argument("--baseline", default=None, help="baseline decoder SPEC (in-process; default: none)")
    ap.add_argument("--candidate", default=None, help=f"candidate decoder SPEC (in-process; default: {DEFAULT_DECODER})")
    ep = ap.add_argument_group("endpoint mode (two live OpenAI-compatible vLLM servers)")
    ep.add_argument("--baseline-url", default=None, help="baseline server, e.g. http://stable:8000")
    ep.add_argument("--candidate-url", default=None, help="candidate server, e.g. http://canary:8000")
    ep.add_argument("--candidate-model", default=None, help="served model name on the candidate if it differs")
    ep.add_argument("--api", default="completions", choices=["completions", "chat"],
                    help="OpenAI API to send prompts to (chat needs a chat template; default: %(default)s)")
    ep.add_argument("--concurrency", type=int, default=16,
                    help="requests in flight for the main runs (the A/A run uses runs.aa_batch_size; default: %(default)s)")
    ep.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default: %(default)s)")
    ep.add_argument("--retries", type=int, default=3,
                    help="retries on connection errors, timeouts, 429 and 5xx, with exponential backoff (default: %(default)s)")
    ap.add_argument("--junit", default=None, help="also write the criteria as JUnit XML to this file")
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "convert":  # `vllm-lookahead gate convert ...`: bring your own eval set
        from vllm_lookahead.gate.convert import main as convert_main

        return convert_main(argv[1:])
    args = build_parser().parse_args(argv)
    # stdout carries the verdict table only; vLLM's own logging goes to stderr
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm_lookahead.gate.endpoint import EndpointError, EndpointOptions
    from vllm_lookahead.gate.engine import RunCrashed
    from vllm_lookahead.gate.run import Endpoints, GateInputs, UsageError, run_gate

    endpoints = None
    try:
        if args.baseline_url or args.candidate_url:
            if not (args.baseline_url and args.candidate_url):
                raise UsageError("endpoint mode needs both --baseline-url and --candidate-url")
            if args.baseline or args.candidate:
                raise UsageError("--baseline/--candidate (decoder SPECs) are for in-process mode; "
                                 "with --baseline-url/--candidate-url the servers decide the decoder")
            try:
                opts = EndpointOptions(timeout_s=args.timeout, retries=args.retries, concurrency=args.concurrency,
                                       api=args.api)
            except ValueError as e:
                raise UsageError(str(e)) from None
            endpoints = Endpoints(args.baseline_url, args.candidate_url, args.model, args.candidate_model, opts)
            baseline = candidate = None
        else:
            baseline = parse_spec(args.baseline or "none")
            candidate = parse_spec(args.candidate or DEFAULT_DECODER)
        policy = load_policy(args.policy)
        items = load_eval_set(args.eval_set, limit=args.limit,
                              tasks=[t for t in args.tasks.split(",") if t] if args.tasks else None)
        if args.limit is not None and args.limit < 1:
            raise UsageError("--limit must be >= 1")
        if args.max_tokens < 1:
            raise UsageError("--max-tokens must be >= 1")
        model = None
        if endpoints is None:
            model = Path(args.model or DEMO_MODEL)
            if not model.is_dir():
                raise UsageError(f"model directory {model} does not exist")
        inp = GateInputs(model, items, Path(args.eval_set).name, baseline, candidate, policy, args.dtype,
                         args.seed, args.max_tokens, args.max_model_len, endpoints)
        report = Path(args.report) if args.report else Path("reports") / time.strftime("gate-%Y%m%dT%H%M%SZ", time.gmtime())
        from vllm_lookahead.gate.run import preflight

        preflight(inp)
    except (SpecError, PolicyError, EvalSetError, UsageError, EndpointError) as e:
        print(f"vllm-lookahead gate: error: {e}", file=sys.stderr)
        return 2
    if endpoints is not None:
        b, c = endpoints.client("baseline"), endpoints.client("candidate")
        print(f"gate: {len(items)} items, baseline {b.url} ({b.model}) vs candidate {c.url} ({c.model}), "
              f"{args.api} API", file=sys.stderr)
    else:
        assert baseline is not None and candidate is not None
        print(f"gate: {len(items)} items, baseline {baseline.text!r} vs candidate {candidate.text!r}, "
              f"model {model}, {args.dtype}", file=sys.stderr)
    try:
        result, paths = run_gate(inp, report)
    except EndpointError as e:  # an endpoint failed its preflight, or the baseline's died scoring: no verdict
        print(f"vllm-lookahead gate: error: {e} (no report written)", file=sys.stderr)
        return 2
    except RunCrashed as e:  # the baseline's (a candidate's crash is a FAIL verdict, handled by run_gate)
        print(f"vllm-lookahead gate: error: the baseline arm crashed, no verdict: {e} (no report written)",
              file=sys.stderr)
        return 2
    except Exception:  # noqa: BLE001 - anything else is no verdict either: never exit 1, which means FAIL
        import traceback

        traceback.print_exc()
        print("vllm-lookahead gate: error: the gate crashed before a verdict (traceback above; no report written)",
              file=sys.stderr)
        return 2
    if args.junit:
        Path(args.junit).parent.mkdir(parents=True, exist_ok=True)
        Path(args.junit).write_text(paths["junit"].read_text())
    from vllm_lookahead.gate.report import criteria_table, seeded_table

    print(criteria_table(result))
    if seeded_table(result):
        print("\n".join(seeded_table(result)))
    print(f"\nverdict: {result['verdict']}" + (f" (failed: {', '.join(result['failed'])})" if result["failed"] else ""))
    if result.get("crash"):
        print(f"{result['criteria'][0]['detail']}\nreport: {paths['html']} (also {paths['junit'].name})")
        return 1
    if result.get("sequential"):
        from vllm_lookahead.gate.report import _sequential_line

        print(_sequential_line(result["sequential"]))
    mde = result["mde"]
    print(f"minimum detectable pass-rate change (80% power, alpha {policy['alpha']}) for these {result['n_items']} "
          f"items: {mde['pass_rate_delta_at_80pct_power'] if mde['pass_rate_delta_at_80pct_power'] is None else round(mde['pass_rate_delta_at_80pct_power'], 3)} "
          f"(observed discordance {mde['observed_discordance']:.3f})")
    print(f"report: {paths['html']} (also {paths['markdown'].name}, {paths['json'].name}, {paths['junit'].name}); "
          f"gate wall time {result['meta']['wall_s']:.1f} s")
    return 0 if result["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
