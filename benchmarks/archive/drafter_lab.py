"""Drafter lab: compression of drafting strategies on a real HF model, without an engine.

Greedy verification is simulated exactly (``vllm_lookahead.core.simulate``) with the model's argmax at
every draft position, so outputs equal plain greedy decoding and only the *number of forward passes*
differs between strategies.  Fast enough to tune W/N/G and the candidate rule on CPU.

    python benchmarks/drafter_lab.py --model models/demo-code-4l --prompts open --n 40 --k 4 \\
        --configs '{}' '{"ngram": 3}' --json benchmarks/results/drafter_lab.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def make_verify(model):
    import torch

    @torch.no_grad()
    def verify(ctx, draft):
        ids = torch.tensor([list(ctx) + list(draft)])
        logits = model(input_ids=ids).logits[0, len(ctx) - 1 :]
        return logits.argmax(-1).tolist()

    return verify


def add_replay_arguments(ap, *, n: int, k: int) -> None:  # noqa: ANN001
    """The command line of a one-drafter replay (``selection_oracle.py``, ``draft_calibration.py``)."""
    ap.add_argument("--model", default="models/demo-code-4l")
    ap.add_argument("--prompts", default="open", help="open, copy or mixed (held-out prompts)")
    ap.add_argument("--n", type=int, default=n, help="prompts, run one after another")
    ap.add_argument("--k", type=int, default=k, help="draft tokens per step (num_speculative_tokens)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="lookahead config override, as in the bench's SPEC (repeatable), e.g. chain_min_p=0.15")
    ap.add_argument("--json", type=Path)


def replay_drafter(args):  # noqa: ANN001, ANN201
    """(tokenizer, verify, config overrides, drafter) for a replay: the demo model on one thread, greedy
    verification from its argmax (``make_verify``), one ``LookaheadDrafter`` with the ``--set`` overrides."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_lookahead.core import LookaheadConfig, LookaheadDrafter
    from vllm_lookahead.decoders import lookahead_overrides

    overrides = lookahead_overrides(args.k, args.set)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    return tok, make_verify(model), overrides, LookaheadDrafter(LookaheadConfig(**overrides), args.k)


class PromptLookupDrafter:
    """vLLM-ngram-like drafting: longest suffix match (max_n..min_n) in the context, nothing else."""

    def __init__(self, k: int, min_n: int = 1, max_n: int = 4):
        from vllm_lookahead.core.context_index import ContextIndex

        self.k = k
        self.index = ContextIndex(min_n, max_n)

    def step(self, rows):
        (row,) = rows
        self.index.extend(list(row.context[len(self.index.tokens) : row.num_tokens]))
        return [self.index.lookup(self.k)[0]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/demo-code-4l")
    ap.add_argument("--prompts", default="open")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--configs", nargs="*", default=["{}"], help="lookahead config dicts (JSON)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_lookahead.core import LookaheadConfig
    from vllm_lookahead.core.simulate import simulate
    from vllm_lookahead.prompts import load_heldout_prompts, read_prompts_jsonl

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    verify = make_verify(model)
    prompts = (load_heldout_prompts(args.n, args.prompts) if args.prompts in ("open", "copy", "mixed")
               else read_prompts_jsonl(args.prompts)[: args.n])
    eos = tok.eos_token_id
    rows = {"prompt_lookup": [0, 0]}
    cfgs = {c: LookaheadConfig.from_dict(json.loads(c)) for c in args.configs}
    for c in cfgs:
        rows[f"lookahead {c}"] = [0, 0]
    sources: dict[str, dict[str, list[int]]] = {}
    t0 = time.time()
    for p in tqdm(prompts, desc="prompts", unit="prompt"):
        ids = tok(p).input_ids
        base = simulate(verify, ids, args.max_tokens, args.k, eos=eos, drafter=PromptLookupDrafter(args.k))
        ref = base.tokens
        rows["prompt_lookup"][0] += len(ref)
        rows["prompt_lookup"][1] += base.steps
        for c, cfg in cfgs.items():
            from vllm_lookahead.core import LookaheadDrafter

            drafter = LookaheadDrafter(cfg, args.k)
            r = simulate(verify, ids, args.max_tokens, args.k, eos=eos, drafter=drafter)
            for st in drafter.states.values():
                for src, (d, a) in st.stats.by_source.items():
                    agg = sources.setdefault(c, {}).setdefault(src, [0, 0])
                    agg[0] += d
                    agg[1] += a
            if r.tokens != ref:
                raise AssertionError(f"simulation diverged from greedy for config {c}")
            rows[f"lookahead {c}"][0] += len(r.tokens)
            rows[f"lookahead {c}"][1] += r.steps
    result = {name: {"tokens": t, "steps": s, "compression": t / s} for name, (t, s) in rows.items()}
    base = result["prompt_lookup"]["compression"]
    print(f"{'strategy':<60}{'compression (tok/step)':>24}{'vs prompt lookup':>18}")
    for name, r in result.items():
        print(f"{name:<60}{r['compression']:>24.3f}{r['compression'] / base:>17.3f}x")
    for c, by in sources.items():
        print(f"  sources {c}: " + ", ".join(f"{s}: {a}/{d} accepted" for s, (d, a) in by.items()))
    print(f"({len(prompts)} {args.prompts} prompts x {args.max_tokens} tokens, k={args.k}, {time.time() - t0:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({"command": "python benchmarks/drafter_lab.py " + " ".join(sys.argv[1:]),
                                         "k": args.k, "n": len(prompts), "results": result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
