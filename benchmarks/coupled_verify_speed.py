"""T>0 lookahead with coupled verification (``vllm/coupled_verify.py``) against vLLM's rejection sampler.

Why: coupled verification replaces vLLM's rejection sampler for T>0 steps on CPU; this measures what that
costs or saves (tokens/s) and whether acceptance changes (it should not: same acceptance probability per
draft).  A fresh engine per run, the two verifiers alternated per repeat (same machine, same process); the same
seeded requests each time, so the coupled runs also show whether a seeded request reproduces across engines.

    python benchmarks/coupled_verify_speed.py --json benchmarks/results/coupled_verify_speed.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time


def main() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/demo-code-4l")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from vllm import SamplingParams

    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.engine import make_llm
    from vllm_lookahead.prompts import load_heldout_prompts
    from vllm_lookahead.vllm import coupled_verify

    prompts = load_heldout_prompts(args.n, "copy")
    params = [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=100 + i)
              for i in range(len(prompts))]
    applies = coupled_verify.applies
    runs: dict[str, list[dict]] = {"coupled": [], "vllm_rejection_sampler": []}
    tokens: dict[str, list] = {"coupled": [], "vllm_rejection_sampler": []}
    warm = load_heldout_prompts(args.batch, "open")  # warm-up on other prompts: the drafter's engine-wide
    warm_params = SamplingParams(temperature=args.temperature, max_tokens=16)  # memory never holds a measured output
    for _ in range(args.repeats):
        for name in runs:
            # a fresh engine per run: lookahead's memory of earlier outputs would otherwise draft a repeated
            # seeded request's own earlier (identical, when coupled) output
            coupled_verify.applies = applies if name == "coupled" else (lambda *a: False)
            llm = make_llm(args.model, parse_spec("lookahead:k=8"), max_model_len=1024, max_num_seqs=args.batch)
            llm.generate(warm, warm_params, use_tqdm=False)
            t0 = time.perf_counter()
            outs = []
            for i in range(0, len(prompts), args.batch):  # static batches of `batch` requests
                outs += llm.generate(prompts[i:i + args.batch], params[i:i + args.batch], use_tqdm=False)
            dt = time.perf_counter() - t0
            del llm
            gc.collect()
            n_tok = sum(len(o.outputs[0].token_ids) for o in outs)
            m = [o.outputs[0].spec_decode_metrics.to_dict() for o in outs]
            drafted = sum(x["num_draft_tokens"] for x in m)
            accepted = sum(x["num_accepted_draft_tokens"] for x in m)
            runs[name].append({"seconds": round(dt, 3), "tokens": n_tok, "tokens_per_s": round(n_tok / dt, 1),
                               "drafted": drafted, "accepted": accepted,
                               "acceptance": round(accepted / max(drafted, 1), 4)})
            tokens[name].append([list(o.outputs[0].token_ids) for o in outs])
            print(name, runs[name][-1], flush=True)
    coupled_verify.applies = applies
    summary = {name: {"tokens_per_s_median": sorted(r["tokens_per_s"] for r in rs)[len(rs) // 2],
                      "acceptance_mean": round(sum(r["acceptance"] for r in rs) / len(rs), 4),
                      "repeats_identical": all(t == tokens[name][0] for t in tokens[name])}
               for name, rs in runs.items()}
    result = {"command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]), "model": args.model,
              "spec": "lookahead:k=8", "n_prompts": len(prompts), "prompts": "copy", "batch": args.batch,
              "temperature": args.temperature, "max_tokens": args.max_tokens, "seeded": True,
              "machine": f"{os.cpu_count()} CPU cores (shared)", "runs": runs, "summary": summary}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
