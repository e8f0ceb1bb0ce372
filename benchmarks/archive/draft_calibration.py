"""Are the chain drafter's acceptance estimates right?  Estimated vs realized commit probability (issue 14).

Policy "chain" drafts a token while its estimated commit probability (``p_cum``: the token *and* all before
it accepted) stays above a floor, and at a busy batch that floor decides which draft rows are worth their
cost -- so the estimates must rank draft tokens well, and ideally be calibrated.  This replays greedy
decoding of held-out prompts one after another through one drafter (the engine's batch-1 order: the
output memory holds the earlier prompts' outputs), verification simulated exactly with the demo model's
argmax (``core.simulate``), and bins every drafted token by its estimate: per bin, the share of tokens
that were really committed.  Per source too (context, memory), and for context drafts the first token's
acceptance by the evidence class of its match (``kernels.suffix_match_evidence``: the matched suffix
occurred once / more often and always followed by the same token / more often with different tokens),
and per source the first token's acceptance by what the other source drafted there (``core.chain``'s
agreement blocks: the same token, a different one, nothing).

    python benchmarks/draft_calibration.py --prompts open --n 48 --k 8 --set chain_min_p=0.15 \\
        --json benchmarks/results/draft_calibration_open_48.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("once", "unanimous", "split")
AGREEMENT = ("alone", "agree", "conflict")
"""core.chain's agreement blocks: what the other source (context / memory) drafts at the first token"""


def code_version() -> dict[str, str]:
    """Which vllm_lookahead this ran (the package imported, its checkout's commit): the script can replay
    older code, e.g. ``PYTHONPATH=<older checkout>``."""
    import subprocess

    import vllm_lookahead

    pkg = Path(vllm_lookahead.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(pkg), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"package": str(pkg), "commit": commit}


TOP_SHARES = (0.25, 0.5, 0.75)
"""``ranking``: the committed share of the best-ranked quarter, half and three quarters of the drafted tokens."""


def ranking_quality(p: list[float], committed: list[bool]) -> dict[str, object]:
    """How well the estimates *order* the drafted tokens -- what a floor at a busy batch relies on, since
    it keeps the best-ranked tokens and drops the rest (calibration alone says nothing about that: a
    constant estimate equal to the mean is calibrated and useless).

    ``auc``: the chance that a committed token has a higher estimate than an uncommitted one (ties count
    half; 0.5 = no better than chance, 1 = a perfect order).  ``brier``: the mean squared error of the
    estimate as a probability.  ``top``: the committed share among the best-ranked ``TOP_SHARES`` of the
    tokens, next to the share a perfect order would reach (every committed token first)."""
    import numpy as np
    from scipy.stats import rankdata

    est = np.asarray(p, dtype=np.float64)
    hit = np.asarray(committed, dtype=bool)
    n, pos = len(est), int(hit.sum())
    out: dict[str, object] = {"tokens": n, "committed": pos, "auc": None, "brier": None, "top": []}
    if n == 0:
        return out
    out["brier"] = float(np.mean((est - hit) ** 2))
    if 0 < pos < n:
        ranks = rankdata(est)  # ties get their mean rank
        out["auc"] = float((ranks[hit].sum() - pos * (pos + 1) / 2) / (pos * (n - pos)))
    order = np.argsort(-est, kind="stable")
    for share in TOP_SHARES:
        m = max(1, int(round(share * n)))
        out["top"].append({"share_of_tokens": share, "committed_share": float(hit[order[:m]].mean()),
                           "perfect_order": min(pos, m) / m})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from drafter_lab import add_replay_arguments, replay_drafter

    add_replay_arguments(ap, n=48, k=8)
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from vllm_lookahead.core.jit import load_kernels
    from vllm_lookahead.core.simulate import simulate
    from vllm_lookahead.prompts import load_heldout_prompts

    tok, verify, overrides, drafter = replay_drafter(args)
    cfg = drafter.cfg
    kern = load_kernels()
    step = drafter.step
    # (committed, draft, source, p_cum, context evidence class, agreement state of the first draft token)
    seen: list[tuple[int, list[int], str, list[float], int, int]] = []
    try:  # the acceptance table's agreement blocks (core.chain; older code has none)
        from vllm_lookahead.core.chain import BLOCK
    except ImportError:
        BLOCK = 0

    def recording_step(rows):
        drafts = step(rows)
        (row,) = rows
        st = drafter.states[row.req_id]
        evidence = -1
        if st.last_source == "context" and hasattr(kern, "suffix_match_evidence"):  # (older code: no classes)
            evidence = int(kern.suffix_match_evidence(st.index.buf, len(st.index.tokens), cfg.min_match,
                                                      cfg.max_match)[2])
        agreement = st.last_cells[0] // BLOCK if BLOCK and st.last_cells else -1
        seen.append((row.num_tokens, list(drafts[0]), st.last_source, list(st.last_p), evidence, agreement))
        return drafts

    drafter.step = recording_step
    bins: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])  # (source or "all", decile) -> n, committed
    first: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # context evidence class -> drafts, first accepted
    # (source, agreement state of the first token) -> drafts, first accepted, sum of its estimates
    agreed: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0.0])
    tokens = steps = drafted = committed = 0
    scored: dict[str, tuple[list[float], list[bool]]] = defaultdict(lambda: ([], []))  # source -> estimates, committed
    t0 = time.time()
    for j, prompt in enumerate(tqdm(load_heldout_prompts(args.n, args.prompts, seed=0), desc="prompts", unit="prompt")):
        ids = tok(prompt).input_ids
        seen.clear()
        res = simulate(verify, ids, args.max_tokens, args.k, eos=tok.eos_token_id, drafter=drafter, req_id=f"q{j}")
        tokens += len(res.tokens)
        steps += res.steps
        full = list(ids) + res.tokens
        for n_committed, draft, source, p_cum, evidence, agreement in seen:
            future = full[n_committed:]
            if not future or not draft:
                continue
            a = 0
            while a < len(draft) and a < len(future) and draft[a] == future[a]:
                a += 1
            for i, q in enumerate(p_cum[: len(draft)]):
                b = min(int(q * 10), 9)
                for key in (("all", b), (source, b)):
                    bins[key][0] += 1
                    bins[key][1] += i < a
                for key in ("all", source):
                    scored[key][0].append(q)
                    scored[key][1].append(i < a)
            drafted += len(draft)
            committed += a
            if evidence >= 0:
                first[CLASSES[evidence]][0] += 1
                first[CLASSES[evidence]][1] += a > 0
            if agreement >= 0:
                v = agreed[(source, AGREEMENT[agreement])]
                v[0] += 1
                v[1] += a > 0
                v[2] += p_cum[0]

    def table(source: str) -> list[dict[str, float | int | str]]:
        return [{"estimate": f"{b / 10:.1f}-{(b + 1) / 10:.1f}", "tokens": v[0], "committed_share": v[1] / v[0]}
                for (s, b), v in sorted(bins.items()) if s == source]

    out = {
        "command": "python benchmarks/draft_calibration.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "code": code_version(), "model": args.model, "prompts": args.prompts, "n": args.n, "k": args.k, "max_tokens": args.max_tokens,
        "config": overrides, "compression": tokens / steps, "drafted_tokens": drafted, "committed_draft_tokens": committed,
        "calibration": {s: table(s) for s in ("all", "context", "memory")},
        "ranking": {s: ranking_quality(*scored[s]) for s in ("all", "context", "memory")},
        "context_first_token_by_evidence": {c: {"drafts": v[0], "first_accepted_share": v[1] / v[0]}
                                            for c, v in first.items()},
        "first_token_by_agreement": {f"{src}/{state}": {"drafts": v[0], "first_accepted_share": v[1] / v[0],
                                                        "first_estimate_mean": v[2] / v[0]}
                                     for (src, state), v in sorted(agreed.items())},
        "definition": "per bin of the estimated commit probability p_cum (deciles), the share of drafted tokens "
                      "that were committed (the token and all before it accepted); a calibrated estimate has "
                      "each bin's share inside the bin; ranking: how well the estimates order the tokens "
                      "(ranking_quality: AUC, Brier score, committed share of the best-ranked tokens)",
    }
    print(f"{args.prompts}, k={args.k}, {overrides}: compression {out['compression']:.3f} tokens/step, "
          f"{drafted} draft tokens, {committed} committed ({committed / max(drafted, 1):.3f}) "
          f"[{time.time() - t0:.0f} s]")
    print(f"{'estimate':<10}{'tokens':>8}{'committed':>11}")
    for row in out["calibration"]["all"]:
        print(f"{row['estimate']:<10}{row['tokens']:>8}{row['committed_share']:>11.3f}")
    rank = out["ranking"]["all"]
    if rank["auc"] is not None:
        print(f"ranking: AUC {rank['auc']:.3f}, Brier {rank['brier']:.3f}; committed share of the best-ranked "
              + ", ".join(f"{100 * t['share_of_tokens']:.0f}% {t['committed_share']:.3f} (perfect {t['perfect_order']:.3f})"
                          for t in rank["top"]))
    for c, v in out["context_first_token_by_evidence"].items():
        print(f"context match {c:<10}: {v['drafts']:>5} drafts, first token accepted {v['first_accepted_share']:.3f}")
    for c, v in out["first_token_by_agreement"].items():
        print(f"{c:<18}: {v['drafts']:>5} drafts, first token accepted {v['first_accepted_share']:.3f} "
              f"(estimated {v['first_estimate_mean']:.3f})")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
