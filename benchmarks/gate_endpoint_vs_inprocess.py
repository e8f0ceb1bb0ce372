"""Verdicts of the gate's two modes side by side: in-process engines vs live vLLM OpenAI servers.

Same model (demo, float32), same eval subset, same policy, same candidates: a correct lookahead
decoder, a greedy fault (CorruptTokenProposer: output token 1 of half the requests replaced) and a
T>0-only fault (DraftTemperatureProposer: draft positions verified at T x factor).  In-process, each
candidate is a SPEC (``custom:<class>``); in endpoint mode, each is a server started with
``--speculative-config model=<class>``.  The endpoint A/A floor comes from the baseline server at
another concurrency, its T>0 scoring from the baseline server's top-K log-probs; in-process from a
chunked rerun and full log-prob rows.  Writes one JSON with the command, per candidate and mode:
verdict, failed criteria, the numbers behind them, wall time.

    python benchmarks/gate_endpoint_vs_inprocess.py --json benchmarks/results/gate_endpoint_vs_inprocess.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import faults  # noqa: E402
from tests.support.vllm_server import VllmServer  # noqa: E402
from vllm_lookahead.decoders import parse_spec  # noqa: E402
from vllm_lookahead.gate.evalset import DEFAULT_EVAL_SET, load_eval_set  # noqa: E402
from vllm_lookahead.gate.policy import load_policy  # noqa: E402
from vllm_lookahead.gate.run import (  # noqa: E402
    Endpoints,
    GateInputs,
    evaluate,
    preflight,
    run_baseline,
    run_candidate,
    score_samples,
)

FAULTY = faults.CLASS_PATH


def candidates(factor: float) -> dict[str, tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    """name -> (class, custom_proposer params (None: lookahead), expected verdict info)."""
    return {
        "lookahead:k=4": ("vllm_lookahead.LookaheadProposer", None, None),
        "greedy fault: CorruptToken fraction 0.5 position 1": (
            FAULTY + "CorruptTokenProposer", {"fraction": 0.5, "position": 1}, None),
        f"T>0-only fault: DraftTemperature factor {factor}": (
            FAULTY + "DraftTemperatureProposer", {"factor": factor}, None),
    }


def spec_text(cls: str, params: dict[str, Any] | None) -> str:
    if params is None:
        return "lookahead:k=4"
    return f"custom:{cls}:k=4," + ",".join(f"{k}={v}" for k, v in params.items())


def summary(res: dict[str, Any]) -> dict[str, Any]:
    em = res["exact_match"]
    sm = res.get("sampled") or {}
    conf = sm.get("conformance") or {}
    lat = res["latency"]["candidate"]
    return {
        "verdict": res["verdict"], "failed": res["failed"],
        "exact_mismatch": f"{em['candidate']['mismatches']}/{em['candidate']['n']}",
        "aa_mismatch": f"{em['aa']['mismatches']}/{em['aa']['n']}" if em.get("aa") else None,
        "batch1_mismatch": (f"{em['batch1']['candidate']['mismatches']}/{em['batch1']['candidate']['n']}"
                            if em["batch1"]["candidate"] else None),
        "pass_rate": {"baseline": res["pass_rate"]["overall"]["base_rate"],
                      "candidate": res["pass_rate"]["overall"]["cand_rate"]},
        "t_samples_per_arm": sm.get("n_candidate"),
        "pit_candidate_p_adjusted": (sm.get("p_adjusted") or {}).get("pit_candidate_ad"),
        "pit_baseline_control_p": (conf.get("pit_baseline_control") or {}).get("p_value"),
        "likelihood_shift_nats_per_token": (conf.get("shift") or {}).get("effect"),
        "mean_pit": conf.get("mean_pit"),
        "acceptance_rate": lat.get("acceptance_rate"), "mean_acceptance_length": lat.get("mean_acceptance_length"),
    }


def items(limit: int) -> list[Any]:
    return [dataclasses.replace(it, max_tokens=min(it.max_tokens or 48, 48))
            for it in load_eval_set(DEFAULT_EVAL_SET, limit=limit) if it.task != "unit_tests"]


def policy(samples: int) -> dict[str, Any]:
    pol = load_policy()
    pol["criteria"]["sampled"]["samples_per_item"] = samples
    pol["runs"]["latency_items"] = 2
    return pol


def in_process(model: Path, cands: dict[str, Any], its: list[Any], pol: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    base_inp = GateInputs(model, its, "subset", parse_spec("none"), parse_spec("none"), pol,
                          default_max_tokens=48, max_model_len=1024)
    clfs = preflight(base_inp)
    base = run_baseline(base_inp)
    runs = {}
    for name, (cls, params, _) in cands.items():
        inp = dataclasses.replace(base_inp, candidate=parse_spec(spec_text(cls, params)))
        runs[name] = (inp, run_candidate(inp))
    score_samples(base_inp, [base.sampled] + [c.sampled for _, c in runs.values()])
    out = {name: summary(evaluate(inp, base, cand, clfs, None, 0.0)[0]) for name, (inp, cand) in runs.items()}
    return {"candidates": out, "wall_s": time.perf_counter() - t0}


def endpoint(model: Path, cands: dict[str, Any], its: list[Any], pol: dict[str, Any], work: Path) -> dict[str, Any]:
    common = ["--served-model-name", "demo", "--max-model-len", "1024", "--enforce-eager", "--dtype", "float32",
              "--seed", "0"]
    args: dict[str, list[str]] = {"baseline": []}
    for name, (cls, params, _) in cands.items():
        a = ["--speculative-config", json.dumps({"model": cls, "num_speculative_tokens": 4})]
        if params is not None:
            a += ["--additional-config", json.dumps({"custom_proposer": params})]
        args[name] = a
    servers = {}
    for i, (name, a) in enumerate(args.items()):
        (work / f"s{i}").mkdir(parents=True, exist_ok=True)
        servers[name] = VllmServer(str(model), env={}, args=common + a, workdir=str(work / f"s{i}"))
    t_start = time.perf_counter()
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.start(timeout_s=1200), servers.values()))
        startup = time.perf_counter() - t_start
        t0 = time.perf_counter()

        def inp_for(name: str) -> GateInputs:
            return GateInputs(None, its, "subset", None, None, pol, default_max_tokens=48,
                              endpoints=Endpoints(servers["baseline"].url, servers[name].url, "demo"))

        first = next(iter(cands))
        base_inp = inp_for(first)
        clfs = preflight(base_inp)
        base = run_baseline(base_inp)
        runs = {}
        for name in cands:
            inp = inp_for(name)
            preflight(inp)
            runs[name] = (inp, run_candidate(inp))
        score_samples(base_inp, [base.sampled] + [c.sampled for _, c in runs.values()])
        out = {name: summary(evaluate(inp, base, cand, clfs, None, 0.0)[0]) for name, (inp, cand) in runs.items()}
        return {"candidates": out, "wall_s": time.perf_counter() - t0, "server_startup_s": startup}
    finally:
        for s in servers.values():
            s.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "models" / "demo-code-4l"))
    ap.add_argument("--limit", type=int, default=2, help="items per task (sandboxed unit tests left out)")
    ap.add_argument("--samples", type=int, default=8, help="T>0 samples per item")
    ap.add_argument("--factor", type=float, default=0.7, help="DraftTemperature factor of the T>0-only fault")
    ap.add_argument("--modes", default="in-process,endpoint")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    model = Path(args.model)
    cands = candidates(args.factor)
    its = items(args.limit)
    pol = policy(args.samples)
    out: dict[str, Any] = {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": model.name, "dtype": "float32", "n_items": len(its), "samples_per_item": args.samples,
        "temperature": pol["criteria"]["sampled"]["temperature"], "policy": "bundled default, latency_items 2",
        "load_avg_start": os.getloadavg(), "modes": {}}
    modes = [m for m in args.modes.split(",") if m]
    if "in-process" in modes:
        out["modes"]["in-process"] = in_process(model, cands, its, pol)
        print(json.dumps(out["modes"]["in-process"], indent=1), file=sys.stderr)
    if "endpoint" in modes:
        with tempfile.TemporaryDirectory() as work:
            out["modes"]["endpoint"] = endpoint(model, cands, its, pol, Path(work))
    if len(out["modes"]) == 2:
        ip, ep = out["modes"]["in-process"]["candidates"], out["modes"]["endpoint"]["candidates"]
        out["same_verdicts"] = all(ip[n]["verdict"] == ep[n]["verdict"] and ip[n]["failed"] == ep[n]["failed"]
                                   for n in cands)
        out["side_by_side"] = [{"candidate": n, "in_process": [ip[n]["verdict"], ip[n]["failed"]],
                                "endpoint": [ep[n]["verdict"], ep[n]["failed"]]} for n in cands]
    out["load_avg_end"] = os.getloadavg()
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out.get("side_by_side", out["modes"]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
