"""How much compression better candidate *selection* could still give at batch 1 (issue 14).

The chain drafter (core/chain.py) offers one draft per step, chosen among its sources' candidates --
the context match, the engine-wide output memory, LADE's pool and the Jacobi iterate -- by estimated
committed tokens.  This replays greedy decoding of held-out prompts one after another through *one*
drafter (as the engine runs them at batch 1: the memory holds the earlier prompts' outputs) and, at
every step, scores each source's full candidate against the output that greedy decoding really
produced: the tokens it would have had accepted.  The best candidate of each step is the *selection
oracle*; its mean over the steps is the ceiling of any rule that picks among these candidates
(without new sources, more rows or a longer k).  Verification is simulated exactly
(``core.simulate``: the demo model's argmax at every draft position, outputs equal greedy decoding).

    python benchmarks/selection_oracle.py --prompts open --n 64 --k 4 \\
        --json benchmarks/results/selection_oracle_open_64.json

"Accepted tokens per step" are averaged over the decode steps that had a token left to predict;
``1 + accepted`` is what a step commits, so the oracle's ``1 + accepted`` next to the drafter's bounds
the compression a perfect selector would reach on the same steps (an estimate: a different choice
would change later steps a little, through the pool and the request's acceptance history).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path


def accepted(cand, ref) -> int:
    """A draft's leading tokens found in ``ref``."""
    n = 0
    for a, b in zip(cand, ref):
        if a != b:
            break
        n += 1
    return n

ROOT = Path(__file__).resolve().parents[1]


def candidates(drafter, req_id: str, k: int) -> tuple[dict[str, list[int]], tuple | None]:
    """Each source's full candidate for the request's next positions (before any floor or cut), and
    the evidence a fixed rule could pick between context and memory by (``rule_key``), or None."""
    st = drafter.states[req_id]
    toks = st.index.tokens
    out: dict[str, list[int]] = {}
    if not toks:
        return out, None
    cont, m = st.index.lookup(k)
    out["context"] = list(cont)
    key = None
    if drafter.memory is not None:
        mem, probs, mm = drafter.memory.lookup_from(st.isolation_key, st.index.buf, len(toks), k)
        out["memory"] = mem
        if cont and mem:
            key = rule_key(list(cont), m, mem, probs, mm)
    for i, cand in enumerate((st.pool.get(toks[-1]) or [])[:4]):
        out[f"pool{i + 1}"] = list(cand)[:k]
    if st.jacobi:
        out["jacobi"] = list(st.jacobi[:k])
    return out, key


def rule_key(context: list[int], match: int, memory: list[int], probs: list[float], mem_match: int) -> tuple:
    """What a fixed rule choosing between a context and a memory candidate could see: the context's
    match length (1..4+), how many leading tokens the two share (0, 1, 2+), the memory's match length
    (1-2 / 3-5 / 6+) and its first token's frequency (fifths)."""
    return (min(match, 4), min(accepted(context, memory), 2), min(mem_match, 6) // 3, min(int(probs[0] * 5), 4))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from drafter_lab import add_replay_arguments, replay_drafter

    add_replay_arguments(ap, n=64, k=4)
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from vllm_lookahead.core.simulate import simulate
    from vllm_lookahead.prompts import load_heldout_prompts

    tok, verify, overrides, drafter = replay_drafter(args)
    step = drafter.step
    seen: list[tuple[int, list[int], tuple]] = []  # (committed tokens, draft, (candidates, rule key))

    def recording_step(rows):
        drafts = step(rows)
        (row,) = rows
        seen.append((row.num_tokens, drafts[0], candidates(drafter, row.req_id, args.k)))
        return drafts

    drafter.step = recording_step
    acc: Counter[str] = Counter()
    wins: Counter[str] = Counter()
    # per rule key: accepted tokens of the context candidate, of the memory's, of the drafter's draft
    by_key: dict[tuple, list[int]] = {}
    scored = tokens = steps = 0
    t0 = time.time()
    for j, prompt in enumerate(tqdm(load_heldout_prompts(args.n, args.prompts, seed=0), desc="prompts", unit="prompt")):
        ids = tok(prompt).input_ids
        seen.clear()
        res = simulate(verify, ids, args.max_tokens, args.k, eos=tok.eos_token_id, drafter=drafter, req_id=f"q{j}")
        tokens += len(res.tokens)
        steps += res.steps
        full = list(ids) + res.tokens
        for n_committed, draft, (cands, key) in seen:
            future = full[n_committed:]
            if not future:  # the last step: nothing left to predict
                continue
            scored += 1
            got = {name: accepted(c, future) for name, c in cands.items()}
            mine = accepted(draft, future)
            acc["drafter"] += mine
            for name, a in got.items():
                acc[name] += a
            acc["oracle_context_memory"] += max(got.get("context", 0), got.get("memory", 0), mine)
            best = max([mine, *got.values()])
            acc["oracle_all"] += best
            if best > mine:
                wins[max(got, key=lambda s: got[s])] += 1
            if key is not None:
                tot = by_key.setdefault(key, [0, 0, 0])
                tot[0] += got["context"]
                tot[1] += got["memory"]
                tot[2] += mine
    per_step = {name: v / max(1, scored) for name, v in acc.items()}
    drafter_c = 1 + per_step["drafter"]
    # the best fixed rule over rule_key, chosen knowing the answers (in-sample: an upper bound for any
    # rule on this evidence): per key, always the context, always the memory, or the drafter's choice
    rule_gain = sum(max(t) - t[2] for t in by_key.values()) / max(1, scored) / drafter_c
    out = {
        "command": "python benchmarks/selection_oracle.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": args.model, "prompts": args.prompts, "n": args.n, "k": args.k, "max_tokens": args.max_tokens,
        "config": overrides, "compression": tokens / steps, "decode_steps_scored": scored,
        "accepted_per_step": per_step,
        "committed_per_step": {"drafter": drafter_c, "oracle_context_memory": 1 + per_step["oracle_context_memory"],
                               "oracle_all": 1 + per_step["oracle_all"]},
        "oracle_gain": {"context_memory": (1 + per_step["oracle_context_memory"]) / drafter_c - 1,
                        "all": (1 + per_step["oracle_all"]) / drafter_c - 1},
        "fixed_rule_bound": {
            "gain": rule_gain, "keys": len(by_key),
            "definition": "more committed tokens per step (fraction of the drafter's) if, per rule_key (context "
                          "match length, shared leading tokens, memory match length, memory's first-token "
                          "frequency), the context, the memory or the drafter's own draft were always taken -- "
                          "whichever did best on these very steps: an upper bound for a fixed rule on that evidence"},
        "steps_where_another_candidate_did_better": dict(wins.most_common()),
    }
    print(f"{'candidate':<24}{'accepted tokens / step':>24}")
    for name, v in sorted(per_step.items(), key=lambda kv: -kv[1]):
        print(f"{name:<24}{v:>24.3f}")
    print(f"compression {out['compression']:.3f} tokens/step; committed per step: drafter {drafter_c:.3f}, "
          f"oracle over context+memory {out['committed_per_step']['oracle_context_memory']:.3f} "
          f"(+{100 * out['oracle_gain']['context_memory']:.1f}%), over all candidates "
          f"{out['committed_per_step']['oracle_all']:.3f} (+{100 * out['oracle_gain']['all']:.1f}%); "
          f"best fixed rule chosen in-sample +{100 * rule_gain:.1f}% "
          f"[{scored} decode steps, {time.time() - t0:.0f} s]")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
