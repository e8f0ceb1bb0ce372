"""``repeated_samples`` on a real stream under unequal traffic splits: an exact decoder stays silent at
90/10 and 10/90, a decoder that reuses its random stream alarms.

The simulation (``tests/sidecar/test_repeats_split.py``) chooses a hard traffic mix; this runs the chart on
real model outputs.  On the demo model, float32: ``--requests`` requests whose prompts are drawn with Zipf
popularity (exponent 1.1) from the held-out open prompts cut to their first ``--prompt-chars`` characters,
sampled at ``--temperature`` with ``--max-tokens`` new tokens, unseeded -- short outputs, so that two samples
of a popular prompt often come out equal, as short chat answers do.  Every request is generated once by
each arm: ``none`` (the baseline) and the default lookahead decoder (the candidate, an exact decoder).
A stream at candidate share s assigns each request to the candidate with probability s and takes that
arm's generation of it; ``reused`` is the candidate at the first split with every sample of a prompt
replaced by its first one (each sample exact on its own, all repeats: what a per-prompt reused generator
emits).

Each stream runs through the sidecar's real service (``quality_sidecar.service.Service``, file source,
default config, no baseline server) -- ``repeat_keys``, the pipeline's chart and its alert sink; recorded
per stream: every alarm with its stream position, the chart's per-arm counts (comparisons, repeats,
prompt-matched pairs, discordant pairs) and its smallest candidate p-value.

    python benchmarks/repeats_split_real.py --json benchmarks/results/repeats_split_real.json

Generations are cached in --work.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = {"baseline": "none", "candidate": "lookahead:k=8"}


def zipf_prompts(n_prompts: int, n_requests: int, seed: int) -> list[int]:
    """Prompt index per request, Zipf(1.1) popularity over ``n_prompts``."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, n_prompts + 1) ** 1.1
    return rng.choice(n_prompts, n_requests, p=pop / pop.sum()).tolist()


def generate(spec: str, prompts: list[str], order: list[int], args: argparse.Namespace) -> list[list[Any]]:
    """[output token ids, output text] of every request (``order``: prompt index per request), one engine."""
    from vllm import SamplingParams

    from vllm_lookahead.decoders import DEMO_MODEL, parse_spec
    from vllm_lookahead.engine import make_llm

    llm = make_llm(str(DEMO_MODEL), parse_spec(spec), dtype="float32", seed=args.seed, max_model_len=1024,
                   max_num_seqs=args.batch)
    outs = llm.generate([prompts[i] for i in order],
                        SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens))
    return [[list(o.outputs[0].token_ids), o.outputs[0].text] for o in outs]


def sample(arm: str, i: int, prompt: str, ids: list[int], text: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "schema_version": "1.4", "request_id": f"{arm}-{i}", "trace_id": f"{i:032x}", "span_id": f"{i:016x}",
        "time": {"arrival_unix_s": 1.8e9 + i, "finish_unix_s": 1.8e9 + i + 1},
        "model": "demo", "deployment": {"arm": arm},
        "decoder": {"method": ARMS[arm].split(":")[0], "dtype": "float32"},
        "sampling": {"temperature": args.temperature, "top_p": 1.0, "top_k": -1, "max_tokens": args.max_tokens,
                     "n": 1, "min_tokens": 0},
        "prompt": {"text": prompt, "sha256": hashlib.sha256(prompt.encode()).hexdigest(), "redacted": False},
        "output": {"text": text, "token_ids": ids, "num_tokens": len(ids),
                   "finish_reason": "length" if len(ids) >= args.max_tokens else "stop"},
    }


def stream(gens: dict[str, list[list[Any]]], prompts: list[str], order: list[int], share: float, reused: bool,
           args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = np.random.default_rng(args.seed + int(share * 1000))
    first: dict[int, list[Any]] = {}
    out = []
    for i, (p, u) in enumerate(zip(order, rng.random(len(order)))):
        arm = "candidate" if u < share else "baseline"
        ids, text = gens[arm][i]
        if reused and arm == "candidate":
            ids, text = first.setdefault(p, [ids, text])
        out.append(sample(arm, i, prompts[p], ids, text, args))
    return out


def run_sidecar(samples: list[dict[str, Any]], work: Path) -> dict[str, Any]:
    """The real service over the stream: alarms (position in the stream) and the repeats chart."""
    from quality_sidecar.service import Service, ServiceConfig

    work.mkdir(parents=True, exist_ok=True)
    path, alerts = work / "stream.jsonl", work / "alerts.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    svc = Service(ServiceConfig.from_dict({"source": f"file://{path}", "alerts": f"file://{alerts}", "progress": False,
                                           "state_path": str(work / "state.json"), "max_samples": len(samples)}),
                  http_port=0)
    from quality_sidecar.detectors.repeats import RepeatChart

    minimum_p, update = [1.0], RepeatChart.update

    def watched(chart: RepeatChart, *a: Any) -> Any:  # the smallest candidate p-value seen (measurement only)
        r = update(chart, *a)
        minimum_p[0] = min(minimum_p[0], r.pvalue)
        return r

    RepeatChart.update = watched  # type: ignore[method-assign]
    t0 = time.time()
    try:
        svc.run()
    finally:
        RepeatChart.update = update  # type: ignore[method-assign]
    wall = time.time() - t0
    position = {s[key]: i for i, s in enumerate(samples) for key in ("request_id", "trace_id")}
    alarms = []
    for line in alerts.read_text().splitlines() if alerts.exists() else []:
        e = json.loads(line)
        last = position.get((e.get("example_request_ids") or [None])[-1])
        alarms.append({"detector": e["detector"], "arm": e["arm"], "stream_position": last, "pvalue": e.get("pvalue")})
    rc = svc.pipeline.charts.repeats.get("demo")
    return {"samples_read": svc.pipeline.counts["samples"], "wall_s": wall, "alarms": alarms,
            "repeated_samples_alarms": [a for a in alarms if a["detector"] == "repeated_samples"],
            "chart_arms": {a: dict(st) for a, st in (rc.arms if rc is not None else {}).items()},
            "min_candidate_pvalue": minimum_p[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=60_000, help="requests per stream")
    ap.add_argument("--prompts", type=int, default=1000, help="held-out open prompts drawn from")
    ap.add_argument("--prompt-chars", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--shares", default="0.9,0.1", help="candidate shares of the traffic, one stream each")
    ap.add_argument("--batch", type=int, default=256, help="max_num_seqs of each arm's engine")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=".bench-work/repeats")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)

    from vllm_lookahead.prompts import load_heldout_prompts

    prompts = [p[: args.prompt_chars] for p in load_heldout_prompts(args.prompts, "open", seed=7)]
    order = zipf_prompts(len(prompts), args.requests, args.seed)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.time()
    gens = {}
    for arm, spec in ARMS.items():
        key = hashlib.sha1(json.dumps(["ids+text", spec, args.requests, args.prompts, args.prompt_chars, args.max_tokens,
                                       args.temperature, args.seed]).encode()).hexdigest()[:12]
        cache = work / f"{arm}-{key}.json"
        if not cache.exists():
            t0 = time.time()
            cache.write_text(json.dumps(generate(spec, prompts, order, args)))
            print(f"[{arm}] {spec}: {args.requests} requests generated in {time.time() - t0:.0f} s", file=sys.stderr)
        gens[arm] = json.loads(cache.read_text())
    shares = [float(s) for s in args.shares.split(",")]
    plan = [(s, False) for s in shares] + [(shares[0], True)]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for share, reused in plan:
            name = f"{'reused' if reused else 'exact'}-{share:g}"
            r = run_sidecar(stream(gens, prompts, order, share, reused, args), Path(tmp) / name)
            r.update(stream=name, candidate_share=share, candidate="reused stream" if reused else ARMS["candidate"])
            runs.append(r)
            c = r["chart_arms"].get("candidate", {})
            print(f"{name}: {r['samples_read']} samples in {r['wall_s']:.0f} s; repeated_samples alarms "
                  f"{len(r['repeated_samples_alarms'])}; candidate comparisons {c.get('comparisons')}, matched "
                  f"{c.get('matched')}, discordant {c.get('discordant')}; min p {r['min_candidate_pvalue']:.3g}",
                  file=sys.stderr)
    out = {"benchmark": "repeats_split_real",
           "command": shlex.join(["python", "benchmarks/repeats_split_real.py",
                                  *(sys.argv[1:] if argv is None else argv)]),
           "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": "demo (models/demo-code-4l)",
           "dtype": "float32", "arms": ARMS, "requests": args.requests, "prompts": args.prompts,
           "prompt_chars": args.prompt_chars, "zipf_exponent": 1.1, "max_tokens": args.max_tokens,
           "temperature": args.temperature, "alpha": 1e-6, "wall_s": time.time() - t_all, "runs": runs}
    Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
