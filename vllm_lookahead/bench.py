"""``vllm-lookahead bench``: none vs ngram vs lookahead on the same prompts, side by side.

For each method and batch size: compression (generated tokens per target forward pass), acceptance
rate and mean accepted length, tokens/s, per-token latency p50/p95, engine steps (and the share of the
wall time spent in steps that carried prompt tokens, whose prompt work no drafter changes), and the fraction of
outputs identical to ``none`` at the same batch size (at temperature > 0 only with per-request seeds,
else null: see ``_mark_exact``).  Sampling
(``--temperature/--top-p/--top-k``, default greedy) is the same for every method.  Optionally the HF
full-LADE reference's compression on the same prompts (``--reference``).  Prints a table, writes JSON
and a plot.

    vllm-lookahead bench --model models/demo-code-4l --prompts open --n 200 \\
        --methods none,ngram,lookahead --batch-sizes 1,8,32 --max-tokens 128 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from vllm_lookahead.decoders import DEFAULT_DECODER, DEMO_MODEL, SpecError, parse_spec
from vllm_lookahead.engine import StepCounter, make_llm


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vllm-lookahead bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model directory (default: the bundled demo model)")
    ap.add_argument("--prompts", default="open",
                    help="open | copy | mixed (held-out stdlib test/ code) or a JSONL file with a 'prompt' field")
    ap.add_argument("--n", type=int, default=64, help="number of prompts (default 64)")
    ap.add_argument("--methods", default=f"none,ngram:k=8,suffix:k=8,{DEFAULT_DECODER}",
                    help="decoder specs separated by commas or spaces, e.g. 'none ngram:k=4,n_min=1 lookahead:k=4,ngram=3'"
                         " (SPEC syntax: docs/gate.md)")
    ap.add_argument("--batch-sizes", default="1,8,32", help="concurrent requests (see --batching)")
    ap.add_argument("--batching", choices=["continuous", "static"], default="continuous",
                    help="continuous (default): all prompts submitted at once to an engine with max_num_seqs = "
                         "batch size, so a finished request is replaced at once, as in serving; static: "
                         "generate() on chunks of batch-size prompts, each chunk waits for its slowest request")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--compile", action="store_true", help="use torch.compile (slower start-up; default eager)")
    ap.add_argument("--isolation", choices=["process", "none"], default="process",
                    help="process (default): every method runs in a fresh spawned process (all engine memory "
                         "returned, no state shared); none: all in this process, one import of vLLM -- much "
                         "faster start-up for smoke runs (scripts/gpu_check.sh --smoke), not for measurements")
    ap.add_argument("--attention-backend", default=None, metavar="NAME",
                    help="vLLM attention backend for every engine (e.g. FLEX_ATTENTION: the 2D layout's CUDA "
                         "path); default: vLLM's choice")
    ap.add_argument("--reference", type=int, default=0, metavar="N",
                    help="also run the HF full-LADE reference on the first N prompts (0 = off)")
    ap.add_argument("--reference-config", nargs="+", default=["5,4,5"],
                    help="W,N,G for the reference, one or more (default 5,4,5); use the 2D methods' W/N/G "
                         "to compare them with full LADE")
    ap.add_argument("--json", type=Path, default=None, help="write results JSON here")
    ap.add_argument("--plot", type=Path, default=None, help="write a PNG plot here (default: next to --json)")
    ap.add_argument("--seed", type=int, default=0, help="prompt selection and engine seed (default 0)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature for every method alike (default 0: greedy, where outputs must "
                         "equal `none`'s)")
    ap.add_argument("--top-p", type=float, default=None, help="top-p for every method (default: vLLM's, 1.0)")
    ap.add_argument("--top-k", type=int, default=None, help="top-k for every method (default: vLLM's, off)")
    ap.add_argument("--request-seed", type=int, default=None, metavar="BASE",
                    help="seed every request: BASE + a hash of its prompt, the same in every method and "
                         "repeat (default: unseeded, as most users run)")
    ap.add_argument("--repeats", type=int, default=1, metavar="N",
                    help="run every method N times, interleaved (repeat 1 of every method, then repeat 2, ...; "
                         "the method order rotates each repeat), and report the median tokens/s with min/max "
                         "per method and batch size, plus each repeat's speed-up over `none` of the same repeat")
    ap.add_argument("--interleave", choices=["methods", "chunks"], default="methods",
                    help="methods (default): within a repeat, each method runs all its batch sizes on its own, one "
                         "after the other; chunks: per batch size, every method's engine is built side by side and "
                         "the prompts run in chunks of max(4, 2 x batch size) requests, each chunk on every method "
                         "in turn (rotating the first) -- methods compared on nearly the same machine state, for "
                         "VMs whose speed drifts over seconds")
    return ap


def load_prompts(arg: str, n: int, seed: int) -> list[str]:
    from vllm_lookahead.prompts import load_heldout_prompts, read_prompts_jsonl

    if arg in ("open", "copy", "mixed"):
        return load_heldout_prompts(n, arg, seed=seed)
    prompts = read_prompts_jsonl(arg)
    return prompts[:n]


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """SamplingParams keyword arguments every method gets alike: max_tokens, temperature and the
    top-p / top-k that were given (left out: vLLM's defaults, so T=0 runs are what they always were)."""
    out: dict[str, Any] = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    for key in ("top_p", "top_k"):
        if getattr(args, key, None) is not None:
            out[key] = getattr(args, key)
    return out


def sampling_record(args: argparse.Namespace) -> dict[str, Any]:
    """The results JSON's ``sampling``: what every request ran with (None = vLLM's default)."""
    return {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
            "request_seed": args.request_seed}


def request_seed(base: int, prompt: str) -> int:
    """A request's seed: ``base`` + a hash of its prompt.  Why the prompt and not its index: each
    method keeps the prompts that fit its own draft length, so indices can shift between methods,
    while a prompt keeps its seed in every method and repeat."""
    return (base + zlib.crc32(prompt.encode())) % 2**31


def per_request(sp: Any, prompts: list[str], args: argparse.Namespace) -> Any:
    """``sp`` itself, or with ``--request-seed`` one copy per prompt carrying that prompt's seed."""
    if args.request_seed is None:
        return sp
    out = []
    for p in prompts:
        one = sp.clone()
        one.seed = request_seed(args.request_seed, p)
        out.append(one)
    return out


WARMUP_PROMPTS = ["def warm_up(x):\n    return x + 1\n", "import sys\n\nprint(sys.argv)\n"]


class _Measured:
    """One method's measurements at one batch size, summed over the ``generate`` calls that made them
    (one call per run; one per chunk with ``--interleave chunks``)."""

    def __init__(self) -> None:
        self.outs: list[Any] = []
        self.wall = self.step_seconds = self.proposer_seconds = 0.0
        self.steps = self.proposer_calls = self.proposer_rows = 0
        self.prompt_steps, self.prompt_seconds = 0, 0.0  # steps that carried prompt tokens (step_counter)
        self.lade2d: Any = None  # the 2D counters' sums: an instance of lade2d.COUNTERS' class

    def run(self, llm: Any, prompts: list[str], sp: Any, static_chunk: int | None) -> None:
        """``llm.generate`` on ``prompts`` (in calls of ``static_chunk`` prompts with static batching),
        timed; the process-wide proposer profile and 2D counters are reset before and read after.
        ``sp``: one SamplingParams for all, or a list aligned with ``prompts`` (per-request seeds)."""
        from vllm_lookahead.lade2d import hooks as lade2d
        from vllm_lookahead.vllm import proposer as proposer_mod

        prof, counters = proposer_mod.PROFILE, lade2d.COUNTERS
        if self.lade2d is None:
            self.lade2d = type(counters)()
        prof.reset()
        counters.reset()
        with StepCounter() as counter:
            t0 = time.perf_counter()
            chunk = static_chunk or len(prompts)
            for i in range(0, len(prompts), chunk):
                params = sp[i : i + chunk] if isinstance(sp, list) else sp
                self.outs.extend(llm.generate(prompts[i : i + chunk], params, use_tqdm=False))
            self.wall += time.perf_counter() - t0
        self.steps += counter.steps
        self.step_seconds += counter.seconds
        self.prompt_steps += counter.prompt_steps
        self.prompt_seconds += counter.prompt_seconds
        self.proposer_seconds += prof.seconds
        self.proposer_calls += prof.calls
        self.proposer_rows += prof.rows
        for key, value in vars(counters).items():
            setattr(self.lade2d, key, getattr(self.lade2d, key) + value)

    def entry(self, drafter: Any) -> dict[str, Any]:
        """The batch size's record (``drafter``: the lookahead drafter of the engine, for its summary)."""
        outs = self.outs
        token_ids = [list(o.outputs[0].token_ids) for o in outs]
        n_tokens = sum(map(len, token_ids))
        drafted = accepted = spec_steps = 0
        hist = np.zeros(0, dtype=np.int64)  # spec steps by number of accepted draft tokens
        tpot = []
        for o in outs:
            m = o.outputs[0].spec_decode_metrics
            if m is not None:
                d = m.to_dict()
                drafted += d["num_draft_tokens"]
                accepted += d["num_accepted_draft_tokens"]
                spec_steps += d["num_spec_steps"]
                h = np.asarray(d.get("acceptance_histogram") or [0], dtype=np.int64)
                if len(h) > len(hist):
                    hist = np.pad(hist, (0, len(h) - len(hist)))
                hist[: len(h)] += h
            st = o.metrics
            n = len(o.outputs[0].token_ids)
            if st is not None and n > 1 and st.last_token_ts > st.first_token_ts > 0:
                tpot.append((st.last_token_ts - st.first_token_ts) / (n - 1))
        wall, secs = self.wall, self.step_seconds
        return {
            "requests": len(outs), "generated_tokens": n_tokens, "wall_s": wall,
            "tokens_per_s": n_tokens / wall, "engine_steps": self.steps,
            "step_time_ms_mean": 1000 * secs / max(self.steps, 1),
            # forward passes that carried prompt tokens (prefill next to decode rows) and their share of the
            # wall time: an upper bound on the prompt work's share, which is the same for every method
            "prompt_steps": self.prompt_steps, "prompt_step_share_of_wall": self.prompt_seconds / wall if wall else None,
            # per-request decoding steps: each request's tokens / the forward passes it took part in
            "compression": _compression(outs),
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_length": (1 + accepted / spec_steps) if spec_steps else None,
            "drafted_tokens": drafted, "accepted_tokens": accepted,
            "tpot_ms_p50": _ms(percentile(tpot, 50)), "tpot_ms_p95": _ms(percentile(tpot, 95)),
            "proposer_cpu_ms_total": 1000 * self.proposer_seconds, "proposer_calls": self.proposer_calls,
            # proposer + hook CPU per request row per step: the part that does not shrink with the model
            "proposer_us_per_row": 1e6 * self.proposer_seconds / self.proposer_rows if self.proposer_rows else None,
            "proposer_share_of_step_time": self.proposer_seconds / secs if secs else None,
            "acceptance_by_position": _acceptance_by_position(hist),
            "lade2d": _lade2d_summary(self.lade2d),
            # lookahead's own account (since engine start, warm-up included): drafts and acceptance by
            # source, the busy-batch guard's measured tokens/s and choices per batch-size bucket
            "drafter": drafter.summary() if drafter is not None else None,
            "token_ids": token_ids,
        }


def _engine(model: str, spec: Any, bs: int, batch_sizes: list[int], args) -> tuple[Any, Any]:
    """A fresh engine for ``spec`` at batch size ``bs`` and its lookahead drafter (None for other
    methods).  The callers warm it up (first-call allocations) on ``WARMUP_PROMPTS``, outside the
    measured set."""
    from vllm_lookahead.vllm import proposer as proposer_mod

    proposer_mod.PROFILE.drafter = None
    llm = make_llm(model, spec, dtype=args.dtype, seed=args.seed, enforce_eager=not args.compile,
                   max_num_seqs=bs if args.batching == "continuous" else max(batch_sizes), max_model_len=2048,
                   extra={"attention_backend": args.attention_backend} if args.attention_backend else None)
    drafter = proposer_mod.PROFILE.drafter  # set by this engine's proposer (lookahead only)
    return llm, drafter


def _fitting(llm: Any, prompts: list[str], k: int, tok_limit: int) -> list[str]:
    """The prompts that leave room for ``tok_limit`` new tokens (and a draft of ``k``) in the 2048-token
    window."""
    max_prompt = 2048 - tok_limit - k - 8
    tokenizer = llm.get_tokenizer()
    return [p for p in prompts if len(tokenizer.encode(p)) <= max_prompt]


def run_method(model: str, spec_text: str, prompts: list[str], batch_sizes: list[int], args) -> dict[str, Any]:
    """One method at every batch size, each on a fresh engine (``--interleave methods``)."""
    from vllm import SamplingParams

    spec = parse_spec(spec_text)
    sp = SamplingParams(**sampling_kwargs(args))
    results: dict[str, Any] = {"method": spec.text, "by_batch_size": {}}
    llm = None
    for bs in batch_sizes:
        # A fresh engine per batch size: a decoder with cross-request memory (suffix decoding's global
        # tree, prefix caching) must not see the outputs of the previous batch size's run of the very
        # same prompts.
        del llm
        gc.collect()
        llm, drafter = _engine(model, spec, bs, batch_sizes, args)
        if bs == batch_sizes[0]:
            prompts = _fitting(llm, prompts, spec.k, args.max_tokens)
        llm.generate(WARMUP_PROMPTS, sp, use_tqdm=False)
        measured = _Measured()
        measured.run(llm, prompts, per_request(sp, prompts, args), bs if args.batching == "static" else None)
        results["by_batch_size"][str(bs)] = measured.entry(drafter)
    del llm
    gc.collect()
    return results


def interleave_chunk(bs: int) -> int:
    """``--interleave chunks``: requests per chunk at batch size ``bs`` -- two batches' worth (so the
    engine refills the batch as requests finish, as in serving), at least 4 (~1 s per method on the
    demo model at batch 1)."""
    return max(4, 2 * bs)


def interleaved_order(n_prompts: int, n_methods: int, chunk: int, start: int = 0) -> list[tuple[int, int, int]]:
    """``--interleave chunks``' schedule: (method index, first prompt, end) in run order.  Every chunk
    of ``chunk`` consecutive prompts runs on every method before the next chunk starts, the first
    method rotating by one each chunk (from ``start``): no method always runs first or last."""
    out = []
    for c, lo in enumerate(range(0, n_prompts, chunk)):
        first = (start + c) % n_methods
        out += [((first + j) % n_methods, lo, min(lo + chunk, n_prompts)) for j in range(n_methods)]
    return out


def run_interleaved(model: str, spec_texts: list[str], prompts: list[str], bs: int, batch_sizes: list[int],
                    args, start: int = 0) -> list[dict[str, Any]]:
    """Every method at batch size ``bs``, interleaved by chunks of prompts (``--interleave chunks``): one
    fresh engine per method, all alive at once, then ``interleaved_order``.  Why: on a shared VM the
    machine's speed moves by tens of percent over tens of seconds; runs of whole methods one after the
    other (~10-60 s each) see different machines, and a ratio of two of them measures that as much as
    the methods.  Chunks of ~1-2 s per method put every method on nearly the same machine."""
    from vllm import SamplingParams

    specs = [parse_spec(t) for t in spec_texts]
    sp = SamplingParams(**sampling_kwargs(args))
    engines = [_engine(model, spec, bs, batch_sizes, args) for spec in specs]
    # one prompt set for all (the same model's tokenizer): room for the longest draft
    prompts = _fitting(engines[0][0], prompts, max(spec.k for spec in specs), args.max_tokens)
    for llm, _ in engines:
        llm.generate(WARMUP_PROMPTS, sp, use_tqdm=False)
    measured = [_Measured() for _ in specs]
    static = bs if args.batching == "static" else None
    sps = per_request(sp, prompts, args)
    for i, lo, hi in interleaved_order(len(prompts), len(specs), interleave_chunk(bs), start):
        measured[i].run(engines[i][0], prompts[lo:hi], sps[lo:hi] if isinstance(sps, list) else sps, static)
    out = [{"method": spec.text, "by_batch_size": {str(bs): m.entry(drafter)}}
           for spec, m, (_, drafter) in zip(specs, measured, engines)]
    del engines
    gc.collect()
    return out


def _repeat_interleaved(run: Any, model: str, specs: list[str], prompts: list[str], batch_sizes: list[int],
                        args, rep: int, load: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One repeat of ``--interleave chunks``: every batch size's ``run_interleaved`` (in a fresh process
    with ``--isolation process``), merged into one result per method; the chunks' first method
    continues its rotation from one repeat to the next."""
    merged = [{"method": parse_spec(t).text, "by_batch_size": {}} for t in specs]
    for bs in batch_sizes:
        print(f"[bench] repeat {rep + 1}/{args.repeats} batch size {bs}: {len(specs)} methods interleaved in "
              f"chunks of {interleave_chunk(bs)} of {len(prompts)} prompts x {args.max_tokens} tokens",
              file=sys.stderr)
        before = _load()
        per_method = run(run_interleaved, model, specs, prompts, bs, batch_sizes, args, rep)
        load.append({"repeat": rep + 1, "batch_size": bs, "before": before, "after": _load()})
        for into, got in zip(merged, per_method):
            into["by_batch_size"].update(got["by_batch_size"])
    return merged


def run_isolated(fn, *args):
    """Run ``fn(*args)`` in a fresh spawned process.  Why: several vLLM 0.32 engines in one process
    break once numba is imported (the ngram proposer imports it; vLLM's Triton-override scan then trips
    over llvmlite objects), and a fresh process also returns all engine memory."""
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def _run_here(fn, *args):
    """``--isolation none``: call ``fn`` in this process (make_llm applies the fix that lets several
    engines share a process once numba is imported, ``vllm/fixes.py``)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return fn(*args)


def _acceptance_by_position(hist: np.ndarray) -> list[float] | None:
    """P(draft position j is accepted) over spec steps, j = 1.. (from vLLM's per-request histograms of
    accepted draft tokens per step; for the 2D layout: candidate tokens accepted per step)."""
    total = int(hist.sum())
    if not total:
        return None
    at_least = hist[::-1].cumsum()[::-1]  # steps with >= j accepted
    last = int(np.nonzero(hist)[0].max())
    return [round(float(at_least[j]) / total, 4) for j in range(1, last + 1)]


def _lade2d_summary(c) -> dict[str, Any] | None:
    """What the 2D path did in this run (None when it never ran)."""
    if not c.steps:
        return None
    return {"request_steps": c.steps, "fallbacks": c.fallbacks, "fixups": c.fixups,
            "accepted_candidate_tokens": c.accepted, "rows_per_step": c.rows / c.steps,
            "tokens_per_step": 1 + c.accepted / c.steps}


def _ms(x: float | None) -> float | None:
    return None if x is None else 1000 * x


def _compression(outs) -> float:
    """Generated tokens per target forward pass, per request (prefill counts as one pass), averaged
    over tokens.  Steps = 1 + spec steps + plain steps; plain steps commit exactly one token each."""
    tokens = steps = 0
    for o in outs:
        n = len(o.outputs[0].token_ids)
        m = o.outputs[0].spec_decode_metrics
        if m is None:
            tokens += n
            steps += n
            continue
        d = m.to_dict()
        spec_tokens = d["num_spec_steps"] + d["num_accepted_draft_tokens"]
        plain = max(n - 1 - spec_tokens, 0)
        tokens += n
        steps += 1 + d["num_spec_steps"] + plain
    return tokens / steps if steps else 0.0


def reference_compression(model: str, prompts: list[str], args) -> list[dict[str, Any]] | None:
    """Compression of the HF full-LADE reference for each ``--reference-config`` W,N,G."""
    try:
        from vllm_lookahead.lade2d.reference import lade_generate, load_model
    except ImportError as e:
        print(f"[bench] reference decoder unavailable: {e}", file=sys.stderr)
        return None
    from tqdm import tqdm
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    hf = load_model(model, dtype="float32")
    out = []
    for config in args.reference_config:
        w, n, g = (int(x) for x in config.split(","))
        tokens = steps = 0
        for p in tqdm(prompts, desc=f"HF LADE W={w} N={n} G={g}", unit="prompt"):
            ids = tok(p).input_ids
            r = lade_generate(hf, ids, args.max_tokens, window=w, ngram=n, pool_size=g,
                              eos_token_id=tok.eos_token_id)
            tokens += len(r.tokens)
            steps += r.steps + 1  # + the prefill pass, as counted for vLLM
        out.append({"W": w, "N": n, "G": g, "prompts": len(prompts),
                    "compression": tokens / steps if steps else None})
    return out


def print_table(results: list[dict[str, Any]], reference: list[dict[str, Any]] | None) -> None:
    hdr = f"{'method':<28}{'batch':>6}{'compr. (tok/step)':>19}{'accept':>8}{'mean acc. len':>14}" \
          f"{'tok/s':>9}{'TPOT p50 ms':>12}{'p95 ms':>8}{'steps':>7}{'exact vs none':>15}{'vs none@bs1':>12}{'proposer % step':>16}{'us/row':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        for bs, m in r["by_batch_size"].items():
            def f(x, fmt):
                return format(x, fmt) if x is not None else "-"
            print(f"{r['method']:<28}{bs:>6}{f(m['compression'], '.3f'):>19}{f(m['acceptance_rate'], '.3f'):>8}"
                  f"{f(m['mean_accepted_length'], '.3f'):>14}{m['tokens_per_s']:>9.1f}{f(m['tpot_ms_p50'], '.2f'):>12}"
                  f"{f(m['tpot_ms_p95'], '.2f'):>8}{m['engine_steps']:>7}{f(m.get('exact_vs_none'), '.3f'):>15}"
                  f"{f(m.get('exact_vs_none_bs1'), '.3f'):>12}"
                  f"{f(None if m['proposer_share_of_step_time'] is None else 100 * m['proposer_share_of_step_time'], '.2f'):>16}"
                  f"{f(m.get('proposer_us_per_row'), '.1f'):>8}")
        for bs, m in r["by_batch_size"].items():
            if m.get("lade2d"):
                d = m["lade2d"]
                print(f"  {r['method']} batch {bs}: 2D request-steps {d['request_steps']}, "
                      f"{d['rows_per_step']:.1f} rows/step, {d['tokens_per_step']:.3f} tokens/step, "
                      f"fix-ups {d['fixups']}, fallbacks to the chain {d['fallbacks']}; acceptance by "
                      f"position {m['acceptance_by_position']}")
    for ref in reference or []:
        print(f"HF full-LADE reference (W={ref['W']} N={ref['N']} G={ref['G']}, "
              f"{ref['prompts']} prompts): compression {ref['compression']:.3f} tokens/step")


def plot(results: list[dict[str, Any]], reference: list[dict[str, Any]] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    batch_sizes = list(results[0]["by_batch_size"])
    width = 0.8 / len(results)
    for i, r in enumerate(results):
        xs = np.arange(len(batch_sizes)) + i * width
        axes[0].bar(xs, [r["by_batch_size"][b]["compression"] for b in batch_sizes], width, label=r["method"])
        axes[1].bar(xs, [r["by_batch_size"][b]["tokens_per_s"] for b in batch_sizes], width, label=r["method"])
    for j, ref in enumerate(reference or []):
        if ref.get("compression"):
            axes[0].axhline(ref["compression"], ls=("--", ":", "-.")[j % 3], color="k",
                            label=f"HF full LADE W{ref['W']}/N{ref['N']}/G{ref['G']} (ref.)")
    for ax, title, unit in ((axes[0], "compression", "tokens / forward pass"), (axes[1], "throughput", "tokens/s")):
        ax.set_xticks(np.arange(len(batch_sizes)) + 0.4 - width / 2, [f"batch {b}" for b in batch_sizes])
        ax.set_title(title)
        ax.set_ylabel(unit)
    handles, labels = axes[0].get_legend_handles_labels()  # below the panels: inside, it hides bars
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    model = args.model
    if model is None:
        if not DEMO_MODEL.exists():  # the demo model lives in a source checkout
            print("vllm-lookahead bench: --model is required outside a source checkout", file=sys.stderr)
            return 2
        model = str(DEMO_MODEL)
    try:
        specs = _split_specs(args.methods)
        for s in specs:
            parse_spec(s)
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
        prompts = load_prompts(args.prompts, args.n, args.seed)
    except (SpecError, ValueError) as e:
        print(f"vllm-lookahead bench: {e}", file=sys.stderr)
        return 2
    if not Path(model, "config.json").exists():
        print(f"vllm-lookahead bench: {model} has no config.json (not a model directory)", file=sys.stderr)
        return 2
    if args.repeats < 1:
        print("vllm-lookahead bench: --repeats must be >= 1", file=sys.stderr)
        return 2
    if args.temperature < 0 or (args.top_p is not None and not 0 < args.top_p <= 1):
        print("vllm-lookahead bench: --temperature must be >= 0 and --top-p in (0, 1]", file=sys.stderr)
        return 2
    code = code_version()  # read before the runs: the code that ran, not what the tree holds afterwards
    runs: list[list[dict[str, Any]]] = []  # runs[repeat][method index]
    load: list[dict[str, Any]] = []
    run = run_isolated if args.isolation == "process" else _run_here
    for rep in range(args.repeats):
        if args.interleave == "chunks":
            runs.append(_repeat_interleaved(run, model, specs, prompts, batch_sizes, args, rep, load))
            continue
        order = list(range(len(specs)))
        order = order[rep % len(order):] + order[: rep % len(order)]  # rotate: no method always runs first
        this: list[dict[str, Any] | None] = [None] * len(specs)
        for i in order:
            print(f"[bench] repeat {rep + 1}/{args.repeats} {specs[i]}: {len(prompts)} prompts x "
                  f"{args.max_tokens} tokens at batch sizes {batch_sizes}", file=sys.stderr)
            before = _load()
            this[i] = run(run_method, model, specs[i], prompts, batch_sizes, args)
            load.append({"repeat": rep + 1, "method": specs[i], "before": before, "after": _load()})
        runs.append([r for r in this if r is not None])
    for rep_results in runs:
        _mark_exact(rep_results, batch_sizes, comparable=args.temperature == 0 or args.request_seed is not None)
    results = _aggregate(runs) if args.repeats > 1 else runs[0]
    add_vs_best_baseline(results)
    reference = reference_compression(model, prompts[: args.reference], args) if args.reference else None
    print_table(results, reference)
    if args.repeats > 1:
        print_spread(results)
    out = {
        "command": "vllm-lookahead bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": model, "prompts": args.prompts, "n_prompts": len(prompts), "max_tokens": args.max_tokens,
        "dtype": args.dtype, "batching": args.batching, "interleave": args.interleave,
        "sampling": sampling_record(args),
        "chunk_requests": ({str(bs): interleave_chunk(bs) for bs in batch_sizes} if args.interleave == "chunks"
                           else None),
        "machine": machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "repeats": args.repeats, "load": load, "code": code,
        "env": {k: os.environ.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")},
        "results": [{**r, "by_batch_size": {b: {k: v for k, v in m.items() if k != "token_ids"}
                                            for b, m in r["by_batch_size"].items()}} for r in results],
        "reference": reference,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"[bench] wrote {args.json}", file=sys.stderr)
    plot_path = args.plot or (args.json.with_suffix(".png") if args.json else None)
    if plot_path:
        plot(results, reference, plot_path)
        print(f"[bench] wrote {plot_path}", file=sys.stderr)
    return 0


def code_version() -> dict[str, Any] | None:
    """The git commit of this package's checkout and whether tracked files differ from it (a result
    should name the code it measured); None outside a git checkout (an installed wheel)."""
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(dirty)}


_VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "asimd", "sve")


def machine() -> dict[str, Any]:
    """What the run ran on: CPU count, platform, CPU model and its vector extensions (from
    /proc/cpuinfo, on Linux).  Why the extensions: vLLM's CPU kernels come in an AVX-512 build and an
    AVX2 build, and the same commit serves very different tokens/s on the two -- figures from machines
    with different extensions are not comparable."""
    out: dict[str, Any] = {"cpu_count": os.cpu_count(), "platform": platform.platform()}
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return out
    fields = dict(line.split(":", 1) for line in info.splitlines()[:64] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    out["cpu_model"] = fields.get("model name")
    out["cpu_vector_isa"] = [f for f in _VECTOR_FLAGS if f in flags]
    return out


def _cpu_steal_s() -> float | None:
    """CPU time the hypervisor gave to other guests since boot, summed over CPUs (``/proc/stat``'s
    "steal" column, in seconds), or None where there is none.  On a VM the repeats' spread can come
    from neighbours that the load average never shows; the difference between a repeat's ``before``
    and ``after`` says how much of its wall time was stolen."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" and len(fields) > 8 else None
    except (OSError, ValueError):
        return None


def _load() -> dict[str, Any]:
    """Machine load at this moment (``uptime``'s 1/5/15-minute averages and the CPU time stolen by
    the hypervisor so far): the runs share the CPU with whatever else runs, and the JSON should say
    how busy it was."""
    one, five, fifteen = os.getloadavg()
    return {"loadavg_1m": one, "loadavg_5m": five, "loadavg_15m": fifteen, "cpu_steal_s": _cpu_steal_s(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _mark_exact(results: list[dict[str, Any]], batch_sizes: list[int], comparable: bool = True) -> None:
    """exact_vs_none: share of outputs identical to `none` at the same batch size (of the same repeat).
    exact_vs_none_bs1: against `none` at the first batch size -- for `none` itself the A/A rate
    (numerical noise from batch shape alone), the yardstick for non-float32 dtypes.
    Not comparable (temperature > 0 without ``--request-seed``): both None.  Unseeded sampled outputs
    differ from `none`'s even where the distribution is the same, so a share would read as a loss of
    quality that is not there.  Seeded, a request's tokens are defined: lookahead's coupled
    verification promises `none`'s (issue 55), vLLM's rejection sampler does not (its draws depend on
    the drafts), so there the share measures seeded reproducibility, not the output distribution."""
    base = next((r for r in results if r["method"] == "none"), None)
    if base is None:
        return
    for r in results:
        for bs, m in r["by_batch_size"].items():
            if not comparable:
                m["exact_vs_none"] = m["exact_vs_none_bs1"] = None
                continue
            ref = base["by_batch_size"][bs]["token_ids"]
            ref1 = base["by_batch_size"][str(batch_sizes[0])]["token_ids"]
            m["exact_vs_none"] = float(np.mean([a == b for a, b in zip(m["token_ids"], ref)]))
            m["exact_vs_none_bs1"] = float(np.mean([a == b for a, b in zip(m["token_ids"], ref1)]))


SPREAD_KEYS = ("tokens_per_s", "speedup_vs_none", "compression", "proposer_share_of_step_time",
               "proposer_us_per_row", "step_time_ms_mean", "prompt_step_share_of_wall")


def _aggregate(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One result per method over the repeats: each batch size's entry is the repeat with the median
    tokens/s, with ``<key>_median/_min/_max/_all`` for the noisy figures, ``speedup_vs_none`` computed
    against `none` of the *same* repeat, and ``exact_vs_none`` the worst repeat (1.0 = every output of
    every repeat identical to `none`)."""
    out = []
    for j, first in enumerate(runs[0]):
        agg: dict[str, Any] = {"method": first["method"], "by_batch_size": {}, "repeats": len(runs)}
        for bs in first["by_batch_size"]:
            reps = [run[j]["by_batch_size"][bs] for run in runs]
            for run, m in zip(runs, reps):
                base = next((r for r in run if r["method"] == "none"), None)
                m["speedup_vs_none"] = (m["tokens_per_s"] / base["by_batch_size"][bs]["tokens_per_s"]
                                        if base is not None else None)
            order = sorted(range(len(reps)), key=lambda i: reps[i]["tokens_per_s"])
            entry = dict(reps[order[len(order) // 2]])
            for key in SPREAD_KEYS:
                vals = [m[key] for m in reps if m.get(key) is not None]
                if vals:
                    entry[f"{key}_median"] = float(np.median(vals))
                    entry[f"{key}_min"], entry[f"{key}_max"] = float(min(vals)), float(max(vals))
                    entry[f"{key}_all"] = [float(v) for v in vals]
            entry["tokens_per_s"] = entry["tokens_per_s_median"]
            for key in ("exact_vs_none", "exact_vs_none_bs1"):
                vals = [m[key] for m in reps if m.get(key) is not None]
                if vals:
                    entry[key] = float(min(vals))
            agg["by_batch_size"][bs] = entry
        out.append(agg)
    return out


BASELINES = ("ngram", "suffix")  # vLLM's own model-free proposers: what lookahead has to beat


def add_vs_best_baseline(results: list[dict[str, Any]]) -> None:
    """Per batch size, every method's tokens/s over the best baseline's (vLLM ngram or suffix,
    whichever served more) *of the same repeat*: ``speedup_vs_best_baseline_median/_min/_max/_all``.
    Why paired: the repeats run interleaved, so a repeat's methods share the machine's state of the
    moment, and the ratio within a repeat cancels what drifts between repeats; a ratio of two medians
    does not.  Works on aggregated results (``tokens_per_s_all``, in repeat order) and on a single run;
    a recorded JSON can be re-read (benchmarks/paired_ratios.py)."""
    for bs in results[0]["by_batch_size"] if results else ():
        per_repeat = {r["method"]: _tokens_per_s_by_repeat(r, bs) for r in results}
        base = [v for meth, v in per_repeat.items() if meth.split(":")[0] in BASELINES and v is not None]
        if not base or len({len(b) for b in base}) != 1:
            continue
        best = np.max(np.array(base, dtype=np.float64), axis=0)
        for r in results:
            vals = per_repeat[r["method"]]
            if r["method"] == "none" or vals is None or len(vals) != len(best):
                continue
            ratio = np.asarray(vals, dtype=np.float64) / best
            m = r["by_batch_size"][bs]
            m["speedup_vs_best_baseline_median"] = float(np.median(ratio))
            m["speedup_vs_best_baseline_min"], m["speedup_vs_best_baseline_max"] = float(ratio.min()), float(ratio.max())
            m["speedup_vs_best_baseline_all"] = ratio.tolist()


def _tokens_per_s_by_repeat(result: dict[str, Any], bs: str) -> list[float] | None:
    m = result["by_batch_size"].get(bs)
    return None if m is None else m.get("tokens_per_s_all") or [m["tokens_per_s"]]


def print_spread(results: list[dict[str, Any]]) -> None:
    """Median [min, max] over the repeats: tokens/s and speed-ups over `none` and over the best baseline
    (ngram or suffix), each of the same repeat."""
    print(f"{'method':<40}{'batch':>6}{'tok/s median [min, max]':>30}{'x none median [min, max]':>30}"
          f"{'x best baseline [min, max]':>30}{'compr.':>8}{'prop. %':>8}")
    for r in results:
        for bs, m in r["by_batch_size"].items():
            if "tokens_per_s_min" not in m:
                continue
            sp, vb = _median_range(m, "speedup_vs_none"), _median_range(m, "speedup_vs_best_baseline")
            share = m.get("proposer_share_of_step_time_median")
            print(f"{r['method']:<40}{bs:>6}"
                  f"{m['tokens_per_s_median']:>12.1f} [{m['tokens_per_s_min']:.1f}, {m['tokens_per_s_max']:.1f}]"
                  f"{sp:>30}{vb:>30}{m['compression']:>8.3f}{'-' if share is None else format(100 * share, '.2f'):>8}")


def _median_range(m: dict[str, Any], key: str) -> str:
    """``key``'s "median [min, max]" over the repeats, or "-" where it was not computed."""
    if f"{key}_median" not in m:
        return "-"
    return f"{m[f'{key}_median']:.3f} [{m[f'{key}_min']:.3f}, {m[f'{key}_max']:.3f}]"


def _split_specs(text: str) -> list[str]:
    """Split 'none,ngram:k=4,lookahead:k=4,ngram=4' into specs: a piece with '=' but no ':' before it
    belongs to the previous spec."""
    out: list[str] = []
    for piece in text.replace(" ", ",").split(","):
        piece = piece.strip()
        if not piece:
            continue
        if out and "=" in piece and ":" not in piece.split("=")[0] and ":" in out[-1]:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


if __name__ == "__main__":
    sys.exit(main())
