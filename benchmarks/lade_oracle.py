"""Independent LADE oracle: hao-ai-lab's own ``lade`` next to this project's HF reference, same W/N/G.

    scripts/setup_lade_oracle.sh      # once: its own venv (lade 0.0.2, transformers 4.34.1, torch 2.13)
    .venv/bin/python benchmarks/lade_oracle.py --prompts open copy --n 30 --max-tokens 96 \\
        --config 7,4,7 --json benchmarks/results/lade_oracle_w7n4g7.json

The project's reference (``vllm_lookahead.lade2d.reference``) shares its pool, layout and verifier with the
vLLM 2D path, so agreement between those two checks the wiring, not fidelity to LADE.  This script
runs the original code (``benchmarks/lade_oracle_worker.py`` in the oracle venv, token ids in, token
ids out) and, in this venv, the reference in several variants that switch its deviations from LADE
on and off one at a time:

* ``reference`` -- the defaults (prompt pool on, bonus token on a full match, window seed 0);
* ``no_prompt_pool`` / ``no_bonus`` -- one deviation off;
* ``lade_compatible`` -- prompt pool off, no bonus, window seed 10 (LADE's ``random.seed(10)``):
  must commit, forward for forward, what ``lade`` commits.

Per prompt it records compression, the tokens each forward committed, and whether every decoder's
output equals plain greedy (the oracle venv's own transformers-4.34 greedy and this venv's).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from vllm_lookahead.lade2d.reference import greedy_generate, load_model
from vllm_lookahead.lade2d.reference.bench import LadeConfig, lade_results, model_eos
from vllm_lookahead.prompts import load_heldout_prompts

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "benchmarks" / "lade_oracle_worker.py"

# name -> lade_generate keyword arguments (the deviations from LADE switched on/off)
VARIANTS: dict[str, dict] = {
    "reference": {"prompt_pool": True, "full_match_bonus": True, "seed": 0},
    "no_prompt_pool": {"prompt_pool": False, "full_match_bonus": True, "seed": 0},
    "no_bonus": {"prompt_pool": True, "full_match_bonus": False, "seed": 0},
    "lade_compatible_seed0": {"prompt_pool": False, "full_match_bonus": False, "seed": 0},
    "lade_compatible": {"prompt_pool": False, "full_match_bonus": False, "seed": 10},
}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/demo-code-4l")
    ap.add_argument("--prompts", nargs="+", default=["open"], choices=["open", "copy"])
    ap.add_argument("--n", type=int, default=30, help="held-out prompts per set")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--config", default="7,4,7", help="W,N,G")
    ap.add_argument("--oracle-python", default=None,
                    help="python of the lade venv (default: run scripts/setup_lade_oracle.sh, cached)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                    help="reference variants to run next to lade (default: all)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--resummarize", type=Path, default=None,
                    help="recompute the summaries of an existing result file from its per-prompt data "
                         "(no decoding) and write it back")
    args = ap.parse_args(argv)
    try:
        w, n, g = (int(x) for x in args.config.split(","))
    except ValueError:
        ap.error(f"--config {args.config!r}: expected W,N,G, e.g. 7,4,7")
    if w < 1 or n < 3 or g < 0 or args.n < 1 or args.max_tokens < 1:
        ap.error("need W >= 1, N >= 3, G >= 0, --n >= 1, --max-tokens >= 1")
    args.wng = (w, n, g)
    return args


def oracle_python(explicit: str | None) -> str:
    """The lade venv's interpreter, building the venv (cached) when not given."""
    if explicit:
        return explicit
    res = subprocess.run([str(ROOT / "scripts" / "setup_lade_oracle.sh")], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"scripts/setup_lade_oracle.sh failed:\n{res.stderr[-2000:]}")
    return res.stdout.strip().splitlines()[-1]


def run_lade(python: str, model: str, wng: tuple[int, int, int], max_new: int, eos: int | None,
             prompts: list[list[int]]) -> dict:
    """hao-ai-lab's LADE on ``prompts`` (token ids) in the oracle venv; the worker's JSON answer."""
    w, n, g = wng
    req = {"model": model, "window": w, "ngram": n, "pool_size": g, "max_new_tokens": max_new,
           "eos_token_id": eos, "prompts": prompts, "threads": 1}
    res = subprocess.run([python, str(WORKER)], input=json.dumps(req), capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"lade worker failed (rc {res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _summary(per_prompt: list[dict]) -> dict:
    tokens = sum(len(p["tokens"]) for p in per_prompt)
    forwards = sum(p["forwards"] for p in per_prompt)
    decode = [a for p in per_prompt for a in p["accepted"][1:]]
    return {
        "tokens": tokens,
        "forwards": forwards,
        "compression": round(tokens / forwards, 4),
        "compression_mean_per_prompt": round(
            sum(len(p["tokens"]) / p["forwards"] for p in per_prompt) / len(per_prompt), 4),
        "compression_excluding_prefill": round(tokens / (forwards - len(per_prompt)), 4),
        "mean_committed_per_decode_step": round(sum(decode) / len(decode), 4),
        "max_committed_per_step": max(decode),
        "outputs_equal_greedy": sum(p["equals_greedy"] for p in per_prompt),
        "prompts": len(per_prompt),
    }


def resummarize(path: Path) -> None:
    """Recompute every summary of a result file from its per-prompt rows (tokens = sum of commits)."""
    data = json.loads(path.read_text())
    for s in data["results"]:
        names = [k for k in s["per_prompt"][0] if isinstance(s["per_prompt"][0][k], dict)]
        for name in names:
            rows = [{"tokens": [0] * sum(p[name]["accepted"]), "forwards": p[name]["forwards"],
                     "accepted": p[name]["accepted"], "equals_greedy": p[name]["equals_greedy"]}
                    for p in s["per_prompt"]]
            s["summary"][name] = _summary(rows)
    data.setdefault("resummarized_by", []).append(
        " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv]))
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"rewrote the summaries of {path}")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.resummarize:
        resummarize(args.resummarize)
        return 0
    torch.set_num_threads(1)
    py = oracle_python(args.oracle_python)
    model = load_model(args.model, "float32")
    tok = AutoTokenizer.from_pretrained(args.model)
    eos = model_eos(model)
    w, n, g = args.wng
    sets = []
    t0 = time.time()
    for spec in args.prompts:
        prompts = [tok(p)["input_ids"] for p in load_heldout_prompts(args.n, spec, seed=0)]
        lade = run_lade(py, args.model, args.wng, args.max_tokens, eos, prompts)
        greedy = [greedy_generate(model, p, args.max_tokens, eos_token_id=eos) for p in prompts]
        methods: dict[str, list[dict]] = {"lade_0.0.2": []}
        for r, gr in zip(lade["results"], greedy, strict=True):
            methods["lade_0.0.2"].append({
                "tokens": r["tokens"], "forwards": r["forwards"], "accepted": r["accepted"],
                "equals_greedy": r["tokens"] == gr,
                "equals_own_venv_greedy": r["tokens"] == r["greedy"],
            })
        for name, kw in VARIANTS.items():
            if name not in args.variants:
                continue
            results = lade_results(model, prompts, args.max_tokens, LadeConfig(w, n, g), eos_token_id=eos, **kw)
            methods[name] = [{"tokens": res.tokens, "forwards": res.forwards, "accepted": res.accepted,
                              "equals_greedy": res.tokens == gr} for res, gr in zip(results, greedy, strict=True)]
        lade_rows, compat = methods["lade_0.0.2"], methods.get("lade_compatible")
        step_equal = [a["accepted"] == b["accepted"] and a["tokens"] == b["tokens"]
                      for a, b in zip(lade_rows, compat or [], strict=False)]
        sets.append({
            "prompt_set": spec,
            "prompts": len(prompts),
            "summary": {name: _summary(rows) for name, rows in methods.items()},
            "checks": {
                "lade_outputs_equal_greedy": sum(r["equals_greedy"] for r in lade_rows),
                "lade_outputs_equal_own_venv_greedy": sum(r["equals_own_venv_greedy"] for r in lade_rows),
                "own_venv_greedy_equals_project_greedy": sum(
                    r["greedy"] == gr for r, gr in zip(lade["results"], greedy, strict=True)),
                "lade_compatible_step_for_step_equal_to_lade": sum(step_equal),
                "all_outputs_equal_greedy": all(
                    r["equals_greedy"] for rows in methods.values() for r in rows),
            },
            "per_prompt": [
                {"prompt_tokens": len(p),
                 **{name: {"compression": round(len(rows[i]["tokens"]) / rows[i]["forwards"], 4),
                           "forwards": rows[i]["forwards"], "accepted": rows[i]["accepted"],
                           "equals_greedy": rows[i]["equals_greedy"]}
                    for name, rows in methods.items()}}
                for i, p in enumerate(prompts)
            ],
            "lade_versions": lade["versions"],
        })
        s = sets[-1]["summary"]
        print(f"{spec}: " + ", ".join(f"{k} {v['compression']:.3f}" for k, v in s.items()))
        print(f"  checks: {sets[-1]['checks']}")
    if args.json:
        out = {
            "command": " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv]),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": args.model,
            "settings": {"W": w, "N": n, "G": g, "max_tokens": args.max_tokens, "n": args.n,
                         "eos_token_id": eos, "dtype": "float32", "prompt_seed": 0, "threads": 1},
            "variants": {"lade_0.0.2": "hao-ai-lab lade==0.0.2 (PyPI), its own venv",
                         **{k: v for k, v in VARIANTS.items() if k in args.variants}},
            "definitions": {
                "compression": "generated tokens / forward passes (prefill counted), summed over prompts",
                "accepted": "tokens committed by each forward, prefill first",
                "equals_greedy": "output == this venv's plain greedy (transformers 5, float32)",
            },
            "machine": {"platform": platform.platform(), "torch": torch.__version__},
            "wall_s": round(time.time() - t0, 1),
            "results": sets,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
