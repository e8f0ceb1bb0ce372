"""Detection power, false alarms, throughput and lag of the quality sidecar.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sidecar_detection_power.py \
        --json benchmarks/results/sidecar_detection_power.json

Streams are synthetic (tests/support/synth.py says how they are generated).  Sections:
1. samples to detection, per injected regression (refusal +2 pp, 3% truncated, one corrupted token in
   2% of greedy outputs, acceptance x0.8, lengths x1.25): a 2,000-sample clean reference per arm,
   then the regression on the candidate arm; greedy outputs of both arms are paired with the baseline's
   output for the same prompt (what --baseline-url replay provides; baseline-arm pairs are the A/A reference).  Clean arms run side by side
   with the same seeds as the baseline of the comparison.
2. false alarms per 100k clean samples: (a) the full pipeline on clean baseline+candidate streams;
   (b) every CUSUM chart on feature streams drawn from the same generative model, fitted on fresh
   2,000-sample references, restarted after each alarm, over many more samples.
3. throughput (samples per CPU-second of this process = per core), cheap path vs full path.
4. consumer lag at a steady 1,000 samples/s through a real Kafka broker.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quality_sidecar.detectors import BernoulliCUSUM, GaussianCUSUM  # noqa: E402
from quality_sidecar.monitor import N_DETECTORS, MonitorConfig  # noqa: E402
from quality_sidecar.pipeline import Pipeline  # noqa: E402
from quality_sidecar.service import ServiceConfig  # noqa: E402
from tests.support.synth import REGRESSIONS, SampleStream  # noqa: E402

EXPECTED = {"refusal": "refusal", "truncation": "truncated", "corrupt_greedy": "exact_match",
            "acceptance": "acceptance_down", "length": "length_up"}


def _pipeline(**mon) -> Pipeline:
    return Pipeline(ServiceConfig.from_dict({"format_code_fraction": 1.0, "monitor": mon}))


def detection_trial(reg: str | None, seed: int, max_after: int, batch: int = 50) -> dict:
    p = _pipeline()
    base = SampleStream(seed=seed * 2 + 1, arm="baseline")
    cand = SampleStream(seed=seed * 2 + 2, arm="candidate")
    for _ in range(2000 // batch):
        bs, cs = base.take(batch), cand.take(batch)
        p.process(bs + cs)
        _replay_all(p, bs + cs, cand)
    cand.regression = reg
    n, fired = 0, []
    while n < max_after:
        bs, cs = base.take(batch), cand.take(batch)
        alarms = p.process(bs + cs)
        alarms += _replay_all(p, bs + cs, cand)
        n += batch
        fired += [(n, a.detector) for a in alarms if a.arm == "candidate"]
        if reg is not None and any(d == EXPECTED[reg] for _, d in fired):
            break
    hit = next((k for k, d in fired if reg is not None and d == EXPECTED[reg]), None)
    return {"detected_after": hit, "alarms": fired[:10]}


def _replay_all(p: Pipeline, samples: list[dict], stream: SampleStream) -> list:
    """Replay pairing of both arms' greedy samples (what --baseline-url replay provides): the
    baseline's greedy output for the same prompt; baseline-arm replays are exact_match's A/A reference."""
    before = len(p.alarm_log)
    for s in samples:
        if s["sampling"]["temperature"] == 0 and s["output"]["text"] is not None:
            k = int(s["prompt"]["text"].split("task_")[1].split("(")[0])
            p.add_replay_pair(s, {"token_ids": stream.baseline_ids(k)})
    return [type("A", (), {"arm": e["arm"], "detector": e["detector"]}) for e in p.alarm_log[before:]]


def detection_section(trials: int, max_after: int) -> dict:
    out = {}
    for reg in REGRESSIONS:
        t0 = time.time()
        res = [detection_trial(reg, 100 + i, max_after) for i in range(trials)]
        hits = [r["detected_after"] for r in res]
        found = [h for h in hits if h is not None]
        out[reg] = {"expected_detector": EXPECTED[reg], "trials": trials, "detected": len(found),
                    "samples_to_detection_median": float(np.median(found)) if found else None,
                    "samples_to_detection_p90": float(np.percentile(found, 90)) if found else None,
                    "samples_to_detection_all": hits, "batch_granularity_samples": 50,
                    "other_alarms_first": sum(1 for r in res if r["alarms"] and r["alarms"][0][1] != EXPECTED[reg]),
                    "wall_s": round(time.time() - t0, 1)}
        print(f"[detect] {reg}: median {out[reg]['samples_to_detection_median']} samples "
              f"({len(found)}/{trials} detected)", file=sys.stderr)
    return out


def full_pipeline_clean(n_per_arm: int, batch: int = 100) -> dict:
    p = _pipeline()
    base, cand = SampleStream(seed=7, arm="baseline"), SampleStream(seed=8, arm="candidate")
    t0 = time.process_time()
    for _ in range(n_per_arm // batch):
        p.process(base.take(batch) + cand.take(batch))
    post_ref = 2 * n_per_arm - 2 * 2000
    return {"samples": 2 * n_per_arm, "samples_after_reference": post_ref, "false_alarms": len(p.alarm_log),
            "alarms": [(e["detector"], e["arm"]) for e in p.alarm_log], "cpu_s": round(time.process_time() - t0, 1)}


def chart_level_clean(n_refs: int, n_each: int, seed: int = 0) -> dict:
    """Every CUSUM chart of one stream on clean feature streams; alarms counted with restarts."""
    cfg = MonitorConfig()
    rng = np.random.default_rng(seed)
    probe = SampleStream(seed=99, arm="candidate")
    pp = _pipeline()
    feats = pp.classify(probe.take(20_000))
    rates = {k: float(np.mean([f.truncated if k == "truncated" else f.flags.get(k, False) for f in feats]))
             for k in ("refusal", "format_invalid", "unsafe", "degenerate", "truncated")}

    def loglen(n):
        return np.log1p(np.minimum(256, np.maximum(1, rng.lognormal(4.5, 0.6, n))).astype(int))

    alarms, total = {}, 0
    for _r in range(n_refs):
        charts = {k: (BernoulliCUSUM(k, cfg.ert_each, cfg.rate_delta, restart_after_alarm=True).fit(rng.random(2000) < p),
                      lambda n, p=p: rng.random(n) < p) for k, p in rates.items()}
        for d in ("up", "down"):
            charts[f"length_{d}"] = (GaussianCUSUM(f"length_{d}", cfg.ert_each, d, cfg.length_shift,
                                                   restart_after_alarm=True).fit(loglen(2000)), loglen)
        charts["acceptance_down"] = (GaussianCUSUM("acceptance_down", cfg.ert_each, "down", cfg.acceptance_shift,
                                                   restart_after_alarm=True).fit(rng.beta(6, 4, 2000)),
                                     lambda n: rng.beta(6, 4, n))
        for k, (chart, draw) in charts.items():
            for _ in range(n_each // 100_000):
                chart.update(draw(100_000))
            alarms[k] = alarms.get(k, 0) + chart.alarms_
        total += n_each
    fa = sum(alarms.values())
    return {"stream_samples": total, "charts": len(alarms), "alarms_per_chart": alarms, "false_alarms_all_charts": fa,
            "false_alarms_per_100k_all_charts": fa / total * 1e5,
            "upper95_per_100k": (fa + 3 if fa == 0 else fa + 2 * math.sqrt(fa)) / total * 1e5,
            "reference_rates": rates, "note": "two-sample family + exact-match slots not simulated here; "
            "each has the same per-detector ERT by construction"}


def throughput(n: int, cheap: bool) -> dict:
    conf = {"format_code_fraction": 0.1 if cheap else 1.0, "monitor": {"text_test": not cheap}}
    p = Pipeline(ServiceConfig.from_dict(conf))
    raws = [json.dumps(s).encode() for s in SampleStream(seed=3, arm="baseline").take(n // 2)
            + SampleStream(seed=4, arm="candidate").take(n // 2)]
    raws = [raws[i // 2 + (i % 2) * (n // 2)] for i in range(n)]  # interleave arms
    for i in range(0, 4000, 500):  # reference windows + calibration, not timed
        p.process([p.decode(r, {}, None) for r in raws[i:i + 500]])
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(4000, n, 500):
        p.process([s for s in (p.decode(r, {}, None) for r in raws[i:i + 500]) if s is not None])
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    return {"path": "cheap" if cheap else "full", "samples": n - 4000, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
            "samples_per_cpu_s": round((n - 4000) / cpu), "config": conf}


PRODUCER = r"""
import json, sys, time
from kafka import KafkaProducer
sys.path.insert(0, sys.argv[4])
from tests.support.synth import SampleStream
bootstrap, topic, rate, _root, seconds, warm = sys.argv[1:7]
rate, seconds, warm = int(rate), int(seconds), int(warm)
gen = SampleStream(seed=5, arm="candidate")
prod = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
for s in gen.take(warm):
    prod.send(topic, value=json.dumps(s).encode())
prod.flush()
time.sleep(15)  # let the consumer fill its reference window and calibrate before the steady phase
msgs = gen.take(rate * seconds)
t0 = time.time()
for i, s in enumerate(msgs):
    delay = t0 + i / rate - time.time()
    if delay > 0:
        time.sleep(delay)
    s["time"]["finish_unix_s"] = time.time()
    prod.send(topic, value=json.dumps(s).encode())
prod.flush()
prod.close()
"""


def lag_section(rate: int, seconds: int, cheap: bool = True) -> dict:
    """Producer in its own process (pre-generated samples, paced to ``rate``), consumer here."""
    import subprocess

    from quality_sidecar.service import Service
    from tests.support.kafka_broker import KafkaBroker

    warm = 2500
    root = str(Path(__file__).resolve().parents[1])
    with KafkaBroker() as broker:
        topic = "samples"
        broker.create_topic(topic)
        cfg = ServiceConfig.from_dict({"source": f"kafka://{broker.bootstrap}/{topic}", "group": "bench",
                                       "progress": False, "format_code_fraction": 0.1 if cheap else 1.0,
                                       "monitor": {"text_test": not cheap}})
        svc = Service(cfg, http_port=None)
        lags: list[float] = []
        orig = svc.pipeline.monitor  # what Service.step calls per batch, after the classifiers
        seen = [0]

        def timed(samples, *args, **kw):
            out = orig(samples, *args, **kw)
            now = time.time()
            for s in samples:
                seen[0] += 1
                if seen[0] > warm:
                    lags.append(now - s["time"]["finish_unix_s"])
            return out

        svc.pipeline.monitor = timed
        prod = subprocess.Popen([sys.executable, "-c", PRODUCER, broker.bootstrap, topic, str(rate), root,
                                 str(seconds), str(warm)])
        last = time.monotonic()
        deadline = time.time() + seconds + 120
        try:
            while len(lags) < rate * seconds and time.time() < deadline:
                svc.step(0.1)
                if time.monotonic() - last > 1.0:
                    svc.checkpoint()
                    last = time.monotonic()
        finally:
            prod.wait(60)
            svc.checkpoint()
            svc.close()
    arr = np.array(lags)
    return {"rate_samples_per_s": rate, "seconds": seconds, "path": "cheap" if cheap else "full",
            "measured_samples": len(arr), "lag_p50_s": float(np.percentile(arr, 50)),
            "lag_p99_s": float(np.percentile(arr, 99)), "lag_max_s": float(arr.max()),
            "note": "lag = time a sample is processed - time it was produced; producer in a separate "
                    "process; 2,500 warm-up samples (reference + calibration) excluded; 2 shared cores"}


SECTIONS = ("detection", "clean", "charts", "throughput", "lag")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, help="output JSON path")
    ap.add_argument("--trials", type=int, default=8, help="trials per regression")
    ap.add_argument("--max-after", type=int, default=3000, help="give up after this many post-change samples")
    ap.add_argument("--clean-per-arm", type=int, default=50_000, help="full-pipeline clean samples per arm")
    ap.add_argument("--chart-refs", type=int, default=10, help="fresh references for the chart-level null run")
    ap.add_argument("--chart-samples", type=int, default=1_000_000, help="samples per reference, chart level")
    ap.add_argument("--lag-seconds", type=int, default=30, help="duration of the 1,000 samples/s lag run")
    ap.add_argument("--skip-lag", action="store_true", help="no Kafka lag run")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated subset of {','.join(SECTIONS)}; a subset updates those sections of an "
                         "existing --json file in place (and records the command per section)")
    a = ap.parse_args(argv)
    sections = [x.strip() for x in a.sections.split(",") if x.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown section(s) {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    if a.skip_lag and "lag" in sections:
        sections.remove("lag")
    command = "OMP_NUM_THREADS=1 .venv/bin/python " + " ".join(["benchmarks/sidecar_detection_power.py", *(argv or sys.argv[1:])])
    partial = set(sections) != set(SECTIONS) and Path(a.json).exists()
    res: dict = json.loads(Path(a.json).read_text()) if partial else {}
    res.setdefault("command", command)
    res.setdefault("section_commands", {})
    res["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                      "load_average_at_start": list(os.getloadavg())}
    res["budget"] = {"ert_total_samples_per_stream": MonitorConfig().ert_total, "detectors": N_DETECTORS,
                     "ert_per_detector": MonitorConfig().ert_each, "goal_false_alarms_per_100k": 1.0}
    t = time.time()
    if "detection" in sections:
        res["detection"] = detection_section(a.trials, a.max_after)
    if "clean" in sections:
        res["clean_full_pipeline"] = full_pipeline_clean(a.clean_per_arm)
        print(f"[clean] {res['clean_full_pipeline']['false_alarms']} alarms", file=sys.stderr)
    if "charts" in sections:
        res["clean_chart_level"] = chart_level_clean(a.chart_refs, a.chart_samples)
        print(f"[clean charts] {res['clean_chart_level']['false_alarms_all_charts']} alarms", file=sys.stderr)
    if "throughput" in sections:
        res["throughput"] = [throughput(24_000, cheap=True), throughput(24_000, cheap=False)]
        print(f"[throughput] {res['throughput']}", file=sys.stderr)
    if "lag" in sections:
        res["lag"] = [lag_section(1000, a.lag_seconds, cheap=True), lag_section(1000, a.lag_seconds, cheap=False)]
        print(f"[lag] {res['lag']}", file=sys.stderr)
    for sec in sections:
        res["section_commands"][sec] = command
    res["wall_s"] = round(time.time() - t, 1)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(res, indent=2))
    print(f"wrote {a.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
