"""Where seeded T>0 samples part from ``none`` when coupled verification is off (bf16): drafting steps or
the engine's plain steps?

Why: coupled verification (``vllm_lookahead/vllm/coupled_verify.py``) needs float32 logits, so in bf16 a
drafted T>0 step goes through vLLM's rejection sampler and a seeded request may get other tokens than
without speculation.  This separates the causes.  One engine per decoder, in-process, the same
``--n`` held-out prompts with the same per-request seeds and batch size:

* ``none`` twice (the A/A: the engine's own reproducibility);
* the default lookahead decoder;
* the same decoder with ``max_batch_draft_tokens=0``: speculation configured, never a draft.

Per decoder: requests whose tokens differ from the first ``none``'s; for lookahead also split by whether
the request had a draft token verified (vLLM's per-request spec-decode metrics).

    python benchmarks/seeded_drafting_split.py --dtype bfloat16 --json benchmarks/results/seeded_drafting_split_bf16.json
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vllm_lookahead.bench import code_version, machine  # noqa: E402 (after the path set-up)
from vllm_lookahead.decoders import DEFAULT_DECODER, DEMO_MODEL, parse_spec  # noqa: E402


def run(spec: str, prompts: list[str], args: argparse.Namespace) -> list[dict]:
    """Token ids and drafted tokens per request."""
    from vllm import SamplingParams

    from vllm_lookahead.engine import make_llm

    llm = make_llm(args.model, parse_spec(spec), dtype=args.dtype, seed=0, max_model_len=1024,
                   max_num_seqs=args.batch)
    sps = [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed + i)
           for i in range(len(prompts))]
    outs = llm.generate(prompts, sps, use_tqdm=False)
    rows = []
    for o in outs:
        m = o.outputs[0].spec_decode_metrics
        rows.append({"token_ids": list(o.outputs[0].token_ids),
                     "drafted": m.to_dict()["num_draft_tokens"] if m is not None else 0})
    del llm
    gc.collect()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEMO_MODEL), help="model dir (default: the demo model)")
    ap.add_argument("--n", type=int, default=96, help="held-out open prompts, one seeded request each")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--batch", type=int, default=16, help="max_num_seqs of every engine")
    ap.add_argument("--seed", type=int, default=1000, help="request i gets seed SEED + i")
    ap.add_argument("--decoder", default=DEFAULT_DECODER, help=f"the lookahead SPEC (default {DEFAULT_DECODER})")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)

    from vllm_lookahead.prompts import load_heldout_prompts

    prompts = load_heldout_prompts(args.n, "open", seed=11)
    specs = {"none": "none", "none_again": "none", "lookahead": args.decoder,
             "lookahead_never_drafting": f"{args.decoder},max_batch_draft_tokens=0"}
    t0 = time.time()
    got = {name: run(spec, prompts, args) for name, spec in specs.items()}
    ref = [r["token_ids"] for r in got["none"]]
    result = {}
    for name, rows in got.items():
        differ = [r["token_ids"] != b for r, b in zip(rows, ref)]
        drafted = [r["drafted"] > 0 for r in rows]
        result[name] = {"spec": specs[name], "requests": len(rows), "differ": sum(differ),
                        "requests_with_drafts": sum(drafted),
                        "differ_with_drafts": sum(d and x for d, x in zip(differ, drafted)),
                        "differ_without_drafts": sum(d and not x for d, x in zip(differ, drafted)),
                        "drafted_tokens": sum(r["drafted"] for r in rows)}
        print(f"{name:25s} differ {result[name]['differ']:3d}/{len(rows)} (with drafts "
              f"{result[name]['differ_with_drafts']}/{result[name]['requests_with_drafts']}, without "
              f"{result[name]['differ_without_drafts']}/{len(rows) - result[name]['requests_with_drafts']})")
    out = {"benchmark": "seeded_drafting_split",
           "command": shlex.join(["python", "benchmarks/seeded_drafting_split.py",
                                  *(sys.argv[1:] if argv is None else argv)]),
           "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": args.model,
           "dtype": args.dtype, "temperature": args.temperature, "max_tokens": args.max_tokens,
           "batch": args.batch, "n": args.n, "wall_s": time.time() - t0, "decoders": result,
           "code": code_version(), "machine": machine()}
    Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
