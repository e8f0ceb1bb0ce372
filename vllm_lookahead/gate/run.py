"""The gate end to end as a library call: validate everything, run the two arms, analyse, report.

Everything that can be wrong with the inputs (spec, eval set, policy, model dir, classifiers) is
checked before the first engine starts, so a usage error costs seconds, not minutes.
"""

from __future__ import annotations

import copy
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_lookahead.decoders import DecoderSpec, SpecError, check_class, parse_spec
from vllm_lookahead.gate.analysis import analyse, crashed_verdict, load_classifiers
from vllm_lookahead.gate.endpoint import (
    EndpointClient,
    EndpointOptions,
    HttpEngine,
    HttpScorer,
    probe,
)
from vllm_lookahead.gate.engine import (
    ArmRuns,
    EngineOptions,
    GateEngine,
    RunCrashed,
    RunResult,
    run_arm,
)
from vllm_lookahead.gate.evalset import EvalItem
from vllm_lookahead.gate.profiles import parse_profiles
from vllm_lookahead.gate.report import write_report


class UsageError(ValueError):
    """Input the gate cannot run with (exit code 2)."""


@dataclass
class Endpoints:
    """Endpoint mode: two live OpenAI-compatible (vLLM) servers instead of in-process engines."""

    baseline_url: str
    candidate_url: str
    model: str | None = None  # served model name on both (default: each server's first model)
    candidate_model: str | None = None  # when the candidate serves it under another name
    opts: EndpointOptions = field(default_factory=EndpointOptions)
    clients: dict[str, EndpointClient] = field(default_factory=dict)  # filled by preflight

    def client(self, role: str) -> EndpointClient:
        if role not in self.clients:
            model = self.candidate_model or self.model if role == "candidate" else self.model
            self.clients[role] = EndpointClient(role, self.baseline_url if role == "baseline" else self.candidate_url,
                                                model, self.opts)
        return self.clients[role]


@dataclass
class GateInputs:
    model: Path | None
    items: list[EvalItem]
    eval_set_name: str
    baseline: DecoderSpec | None
    candidate: DecoderSpec | None
    policy: dict[str, Any]
    dtype: str = "float32"
    seed: int = 0
    default_max_tokens: int = 48
    max_model_len: int | None = None
    endpoints: Endpoints | None = None


def preflight(inp: GateInputs) -> list[Any]:
    """Fail fast on anything but the engine itself; returns the classifiers to use.  Endpoint mode:
    both servers answer, serve the model, return token ids and share a tokenizer, and the baseline
    returns prompt log-probs if the T>0 check will run (``EndpointError``: exit 2)."""
    if inp.endpoints is not None:
        ep = inp.endpoints
        probe(ep.client("baseline"), ep.client("candidate"))
        if inp.policy["criteria"]["sampled"]["samples_per_item"] > 0:
            HttpScorer(ep.client("baseline")).check()
        return _classifiers(inp)
    assert inp.model is not None and inp.baseline is not None and inp.candidate is not None
    if not (inp.model / "config.json").is_file():
        raise UsageError(f"model directory {inp.model} has no config.json")
    for spec in (inp.baseline, inp.candidate):
        if spec.kind in ("lookahead", "lookahead2d"):
            try:
                check_class(spec.describe()["class"], spec.text)
            except SpecError as e:
                raise UsageError(f"{e} (the lookahead proposer is not installed in this build)") from None
    return _classifiers(inp)


def _classifiers(inp: GateInputs) -> list[Any]:
    try:
        return load_classifiers(inp.policy["criteria"]["behaviour"]["classifiers"])
    except ImportError as e:
        raise UsageError(f"quality_sidecar.classifiers is not importable ({e}): install the sidecar package") from None
    except ValueError as e:
        raise UsageError(str(e)) from None


def opts_for(inp: GateInputs) -> EngineOptions:
    return EngineOptions(str(inp.model), inp.dtype, inp.seed, inp.max_model_len, inp.default_max_tokens)


def http_engine(inp: GateInputs, role: str) -> HttpEngine:
    assert inp.endpoints is not None
    return HttpEngine(inp.endpoints.client(role), inp.default_max_tokens, inp.seed)


def _progress(msg: str) -> None:
    print(f"gate: {msg}", file=sys.stderr, flush=True)


def latency_items(inp: GateInputs) -> list[EvalItem]:
    return inp.items[: inp.policy["runs"]["latency_items"]]


def run_baseline(inp: GateInputs) -> ArmRuns:
    """Baseline arm: greedy batched, the A/A partner (every item at ``runs.aa_batch_size``), the
    batch-1 latency subset, optional T>0 samples (per-request seeds: again at ``runs.aa_batch_size``,
    the ``seeded_exact`` A/A)."""
    s = inp.policy["criteria"]["sampled"]
    if inp.endpoints is not None:
        # A/A from the baseline endpoint itself: the same prompts again at another concurrency
        return http_engine(inp, "baseline").run_arm(
            inp.items, name="baseline", sequential_items=latency_items(inp), samples=s["samples_per_item"],
            profiles=parse_profiles(s["profiles"]), aa_batch_size=inp.policy["runs"]["aa_batch_size"],
            concurrency=inp.endpoints.opts.concurrency, progress=_progress)
    assert inp.baseline is not None
    return run_arm(opts_for(inp), inp.baseline, inp.items, name="baseline", sequential_items=latency_items(inp),
                   samples=s["samples_per_item"], profiles=parse_profiles(s["profiles"]),
                   aa_batch_size=inp.policy["runs"]["aa_batch_size"])


def run_candidate(inp: GateInputs) -> ArmRuns:
    s = inp.policy["criteria"]["sampled"]
    if inp.endpoints is not None:
        return http_engine(inp, "candidate").run_arm(
            inp.items, name="candidate", sequential_items=latency_items(inp), samples=s["samples_per_item"],
            profiles=parse_profiles(s["profiles"]), concurrency=inp.endpoints.opts.concurrency, progress=_progress)
    assert inp.candidate is not None
    return run_arm(opts_for(inp), inp.candidate, inp.items, name="candidate", sequential_items=latency_items(inp),
                   samples=s["samples_per_item"], profiles=parse_profiles(s["profiles"]))


def score_samples(inp: GateInputs, runs: list[RunResult | None]) -> float:
    """Score T>0 runs under a fresh engine without speculation (same model, dtype, seed); seconds.

    A separate engine, not the baseline arm's, because it runs with prefix caching (each prompt is
    computed once for all its samples in both arms) while the measured arms must not."""
    todo = [r for r in runs if r is not None]
    if not todo:
        return 0.0
    if inp.endpoints is not None:  # the baseline endpoint's top-K log-probs
        return HttpScorer(inp.endpoints.client("baseline"), inp.seed, inp.endpoints.opts.concurrency).score(todo)
    with GateEngine(opts_for(inp), parse_spec("none"), prefix_caching=True) as eng:
        return eng.score(todo)


def _meta(inp: GateInputs, base: ArmRuns | None, cand: ArmRuns | None, wall_s: float) -> dict[str, Any]:
    """The report's ``meta``: what ran where (``cand`` None: the candidate crashed before finishing)."""
    try:
        import vllm

        vllm_version = vllm.__version__
    except ImportError:  # endpoint mode does not need vLLM on the gate's machine
        vllm_version = None
    if inp.endpoints is not None:
        bdesc, cdesc = http_engine(inp, "baseline").describe(), http_engine(inp, "candidate").describe()
        model, model_name, mode = bdesc["url"], str(bdesc["model"]), "endpoint"
    else:
        assert inp.model is not None and inp.baseline is not None and inp.candidate is not None
        bdesc, cdesc = inp.baseline.describe(), inp.candidate.describe()
        model, model_name, mode = str(inp.model), inp.model.name, "in-process"

    def wall(arm: ArmRuns | None, run: str) -> float | None:
        r = getattr(arm, run) if arm is not None else None
        return r.wall_s if r is not None else None

    return {
        "mode": mode, "model": model, "model_name": model_name, "eval_set_name": inp.eval_set_name,
        "baseline": bdesc, "candidate": cdesc, "dtype": inp.dtype if mode == "in-process" else "as served",
        "seed": inp.seed, "alpha": inp.policy["alpha"], "policy": inp.policy, "vllm_version": vllm_version,
        "python": platform.python_version(), "machine": platform.machine(), "wall_s": wall_s,
        "startup_s": {"baseline": base.startup_s if base else None, "candidate": cand.startup_s if cand else None},
        "run_wall_s": {"baseline_batch": wall(base, "greedy"), "candidate_batch": wall(cand, "greedy"),
                       "aa": wall(base, "aa"), "sampled_aa": wall(base, "sampled_aa"),
                       "baseline_sequential": wall(base, "sequential"),
                       "candidate_sequential": wall(cand, "sequential"),
                       "scoring": sum(a.sampled.scoring_s or 0 for a in (base, cand)
                                      if a is not None and a.sampled is not None)}}


def _runs_json(base: ArmRuns | None, cand: ArmRuns | None) -> dict[str, Any]:
    """``runs.json``: every raw run of each arm (an arm that did not finish: None)."""
    def arm(a: ArmRuns | None, keys: tuple[str, ...]) -> dict[str, Any] | None:
        return None if a is None else {k: (getattr(a, k).to_json() if getattr(a, k) is not None else None)
                                       for k in keys}

    return {"baseline": arm(base, ("greedy", "aa", "sequential", "sampled", "sampled_aa")),
            "candidate": arm(cand, ("greedy", "sequential", "sampled"))}


def evaluate(inp: GateInputs, base: ArmRuns, cand: ArmRuns, classifiers: list[Any],
             report_dir: Path | None, wall_s: float,
             override: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Path]]:
    """Analyse two finished arms and (optionally) write the report (``override``: a result already
    analysed, e.g. by the sequential loop, to report as it is)."""
    result = override if override is not None else analyse(
        inp.items, base, cand, inp.policy, classifiers, [it.id for it in latency_items(inp)],
        dtype=inp.dtype if inp.endpoints is None else None)
    result["meta"] = _meta(inp, base, cand, wall_s)
    paths = write_report(result, _runs_json(base, cand), report_dir) if report_dir is not None else {}
    return result, paths


def crashed(inp: GateInputs, base: ArmRuns | None, crash: RunCrashed, report_dir: Path | None,
            wall_s: float) -> tuple[dict[str, Any], dict[str, Path]]:
    """The candidate died on requests the baseline served: a FAIL verdict with the crash in the
    report (``analysis.crashed_verdict``), and the baseline's runs in ``runs.json``."""
    _progress(f"candidate crashed: {crash}")
    result = crashed_verdict(crash.to_json(), len(inp.items))
    result["meta"] = _meta(inp, base, None, wall_s)
    paths = write_report(result, _runs_json(base, None), report_dir) if report_dir is not None else {}
    return result, paths


def run_gate(inp: GateInputs, report_dir: Path | None) -> tuple[dict[str, Any], dict[str, Path]]:
    classifiers = preflight(inp)
    t0 = time.perf_counter()
    looks = inp.policy["sequential"]["looks"]
    if looks > 1:
        return run_sequential(inp, classifiers, report_dir, t0)
    base = run_baseline(inp)  # RunCrashed here propagates: a broken baseline gives no verdict
    try:
        cand = run_candidate(inp)
    except RunCrashed as crash:
        return crashed(inp, base, crash, report_dir, time.perf_counter() - t0)
    score_samples(inp, [base.sampled, cand.sampled])
    return evaluate(inp, base, cand, classifiers, report_dir, time.perf_counter() - t0)


def run_sequential(inp: GateInputs, classifiers: list[Any], report_dir: Path | None,
                   t0: float) -> tuple[dict[str, Any], dict[str, Path]]:
    """The eval set in stages (``gate.sequential``): after each, analyse everything run so far at the
    look's spent alpha; stop at the first look where a FAIL is decided, else judge the whole set at the
    last look's level."""
    import dataclasses

    from vllm_lookahead.gate import sequential as sq

    pol = inp.policy
    stages = sq.split(inp.items, pol["sequential"]["looks"])
    n_all = len(inp.items)
    ran: list[EvalItem] = []
    fractions = []
    for st in stages:
        ran_n = len(ran) + len(st)
        fractions.append(ran_n / n_all)
        ran = ran + st
    alphas = sq.look_alphas(len(stages), pol["alpha"], fractions)
    alphas_s = sq.look_alphas(len(stages), pol["criteria"]["sampled"]["alpha"], fractions)
    base = cand = None
    done: list[EvalItem] = []
    looks_log: list[dict[str, Any]] = []
    for k, st in enumerate(stages):
        stage_pol = copy.deepcopy(pol)
        if k > 0:
            stage_pol["runs"]["latency_items"] = 0  # the batch-1 latency subset runs once, in stage 1
        stage_inp = dataclasses.replace(inp, items=st, policy=stage_pol)
        b = run_baseline(stage_inp)
        try:
            c = run_candidate(stage_inp)
        except RunCrashed as crash:
            return crashed(dataclasses.replace(inp, items=done + st), sq.merge(base, b), crash, report_dir,
                           time.perf_counter() - t0)
        for r in (b.sampled, c.sampled):
            if r is not None:
                r.name = f"{r.name} [look {k + 1}]"  # PIT randomisation drawn afresh per look
        score_samples(stage_inp, [b.sampled, c.sampled])
        base, cand = sq.merge(base, b), sq.merge(cand, c)
        done = done + st
        last = k == len(stages) - 1
        look_inp = dataclasses.replace(inp, items=done, policy=sq.policy_at(pol, alphas[k], alphas_s[k]))
        result, _ = evaluate(look_inp, base, cand, classifiers, None, time.perf_counter() - t0)
        decided = sq.decided_fail(result, alphas[k], alphas_s[k])
        looks_log.append({"look": k + 1, "items": len(done), "fraction": fractions[k], "alpha": alphas[k],
                          "sampled_alpha": alphas_s[k], "decided_fail": decided, "verdict": result["verdict"]})
        _progress(f"look {k + 1}/{len(stages)}: {len(done)} items, alpha {alphas[k]:.3g}: "
                  + (f"FAIL decided ({', '.join(decided)})" if decided else "not decided" if not last
                     else result["verdict"]))
        if decided or last:
            break
    seq_info = {"looks": len(stages), "spending": "obrien_fleming (Lan-DeMets), union bound over looks",
                "alphas": alphas, "sampled_alphas": alphas_s, "stopped_at": len(looks_log),
                "stopped_early": len(looks_log) < len(stages), "history": looks_log}
    look_inp = dataclasses.replace(inp, items=done, policy=sq.policy_at(pol, alphas[len(looks_log) - 1],
                                                                        alphas_s[len(looks_log) - 1]))
    assert base is not None and cand is not None
    result, _ = evaluate(look_inp, base, cand, classifiers, None, time.perf_counter() - t0)
    if looks_log[-1]["decided_fail"]:
        result["verdict"] = "FAIL"
        result["failed"] = sorted(set(result["failed"]) | set(looks_log[-1]["decided_fail"]))
    result["sequential"] = seq_info
    paths: dict[str, Path] = {}
    if report_dir is not None:
        result, paths = evaluate(look_inp, base, cand, classifiers, report_dir, time.perf_counter() - t0,
                                 override=result)
    return result, paths
