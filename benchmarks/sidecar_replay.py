"""A 3,000-sample T>0 stream replayed through the sidecar at full speed, from a file and from a real
Kafka topic holding it all as lag: every selected sample is scored and a +0.3 nat/token fault alarms.

The situation of a consumer catching up after a restart or a deploy.  On the demo model, held-out open
prompts at T=1: a baseline arm (no speculation) leads with ``--lead`` samples, then baseline and
candidate alternate 1:1 up to ``--samples``.  Two candidates, each its own stream:
  * ``fault``: a verifier that samples draft positions at 0.8x the temperature (sharper than specified,
    ``tests.faults.DraftTemperatureProposer``; about +0.3 nat/token under the model's likelihood);
  * ``exact``: the default lookahead proposer (an exact decoder: any alarm is a false alarm);
  * ``control``: the fault's own proposer with the fault off (factor 1.0): the matched exact control,
    drafting as the fault does;
  * ``corrupt`` / ``corrupt_control`` (for ``--temperature 0``, where the T=0 replay check judges): the token
    at output position 2 becomes id + 1 in 10% of requests (``tests.faults.CorruptTokenProposer``), and the
    same proposer with ``fraction=0``.
Each stream is read by the sidecar's real service (``quality_sidecar.service.Service``, the code behind
``quality-sidecar run``) with its default config (plus the model's ``vocab_size``), scoring every T>0
sample against a real ``vllm-lookahead serve`` baseline server (no speculation, float32) -- once from a
JSONL file read as fast as it goes, once from a Kafka topic the whole stream was produced to before the
consumer started.  Recorded per run: selected / scored / failed samples per arm (the exported
counters), every alarm with the candidate samples read up to the sample that raised it, the measured
log-prob shift, wall time, and samples committed before they were scored (``CommitAudit``).

``--outage-s S`` adds, per stream, a Kafka replay with the baseline server stopped for S seconds once the
sidecar has read ``--outage-at`` samples (records arrive in batches: it stops at the first check past
that), then started again on its port; ``outage_vs_no_outage`` compares the first conformance alarm's
position with the replay without the outage.

    python benchmarks/sidecar_replay.py --json benchmarks/results/sidecar_replay.json

Generations are cached in --work.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout first: tests.faults, tests.support (CONTRIBUTING.md)

ARMS = {
    "none": "none",
    "exact": "lookahead:k=4",
    "fault": "custom:tests.faults.DraftTemperatureProposer:k=4,factor=0.8",
    "late": "custom:tests.faults.LateDraftTemperatureProposer:k=4,factor=0.7",
    # the matched exact control: the faults' proposer with the fault off (same drafts, same positions)
    "control": "custom:tests.faults.DraftTemperatureProposer:k=4,factor=1.0",
    # T=0: the token at output position 2 becomes id + 1 in 10% of requests, and its matched control
    "corrupt": "custom:tests.faults.CorruptTokenProposer:k=4,fraction=0.1",
    "corrupt_control": "custom:tests.faults.CorruptTokenProposer:k=4,fraction=0.0",
}
CONFORMANCE_DETECTORS = ("sampling_conformance", "impossible_tokens", "repeated_samples")


def _sample(row: dict, prompt: str, arm: str, method: str, i: int, args: argparse.Namespace, text: str) -> dict:
    ids = row["output_ids"]
    return {
        "schema_version": "1.4", "request_id": f"{arm}-{i}", "trace_id": uuid.uuid4().hex,
        "span_id": uuid.uuid4().hex[:16],
        "time": {"arrival_unix_s": 1.8e9 + i, "finish_unix_s": 1.8e9 + i + 1},
        "model": args.served_model, "deployment": {"arm": arm}, "decoder": {"method": method, "dtype": args.dtype},
        "sampling": {"temperature": args.temperature, "top_p": 1.0, "top_k": -1, "max_tokens": args.max_tokens,
                     "n": 1, "min_tokens": 0},
        "prompt": {"text": prompt, "sha256": hashlib.sha256(prompt.encode()).hexdigest(), "redacted": False},
        "prompt_token_ids": row["prompt_ids"],
        "output": {"text": text, "token_ids": ids, "num_tokens": len(ids), "finish_reason": row["finish_reason"]},
    }


def build_stream(base: list[dict], cand: list[dict], args: argparse.Namespace) -> list[dict]:
    """``lead`` baseline samples, then baseline/candidate alternating, ``samples`` in all."""
    b, c = iter(base), iter(cand)
    out = [next(b) for _ in range(args.lead)]
    while len(out) < args.samples:
        out.append(next(c) if (len(out) - args.lead) % 2 else next(b))
    return out


def samples_from_rows(rows: list[dict], arm: str, method: str, prompts: list[str], args: argparse.Namespace,
                      start: int) -> list[dict]:
    """Samples as the producer writes them, the output text included (the behavioural classifiers read it)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.served_model)
    texts = tok.batch_decode([r["output_ids"] for r in rows], skip_special_tokens=True)
    return [_sample(r, prompts[r["prompt_index"]], arm, method, start + i, args, text)
            for i, (r, text) in enumerate(zip(rows, texts))]


def produce(spec: str, label: str, sink: str, args: argparse.Namespace) -> None:
    """Generate one arm through the plugin's own producer (telemetry on, every request sampled to a
    file): the samples are what production would put on Kafka, draft masks included.  Run in a
    process of its own (the telemetry configuration is per process)."""
    import os

    os.environ.update(VLLM_LOOKAHEAD_TELEMETRY="1", VLLM_LOOKAHEAD_SAMPLE_RATE="1", VLLM_LOOKAHEAD_OTEL="0",
                      VLLM_LOOKAHEAD_SAMPLE_SINK=f"file://{sink}", VLLM_LOOKAHEAD_ARM=label,
                      VLLM_LOOKAHEAD_QUEUE_SIZE="100000")  # a benchmark keeps every sample
    from vllm import SamplingParams

    from vllm_lookahead.decoders import DEMO_MODEL, parse_spec
    from vllm_lookahead.engine import make_llm
    from vllm_lookahead.prompts import load_heldout_prompts

    model = args.model or str(DEMO_MODEL)
    prompts = load_heldout_prompts(args.prompts, "open", seed=7)
    llm = make_llm(model, parse_spec(spec), dtype=args.dtype, seed=args.seed, max_model_len=1024,
                   max_num_seqs=args.batch if spec == "none" else args.candidate_batch,
                   extra={"per_request_spec_decode_metrics": "detailed"} if spec != "none" else None)
    jobs = [p for _ in range(args.samples_per_prompt) for p in prompts]
    llm.generate(jobs, SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens))
    from vllm_lookahead.telemetry.frontend import install_if_configured

    telemetry = install_if_configured()
    telemetry.shutdown(timeout_s=120)  # flush the sink before the process ends
    dropped = sum(telemetry.stats.dropped.values())
    if dropped:
        raise SystemExit(f"the producer dropped {dropped} samples")


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


class Outage:
    """Stop the baseline server once the sidecar has read ``at`` samples, keep it down ``seconds``, start
    it again on the same port; measured: the time from stop to the server answering /health again."""

    def __init__(self, server: Any, at: int, seconds: float):
        self.server, self.at, self.seconds = server, at, seconds
        self.down_s: float | None = None
        self.samples_read_at_stop: int | None = None

    def run(self, svc: Any) -> None:
        while svc.pipeline.counts["samples"] < self.at and not svc.stopping.is_set():
            time.sleep(0.05)
        self.samples_read_at_stop = svc.pipeline.counts["samples"]
        t0 = time.monotonic()
        self.server.stop()
        print(f"  baseline server stopped at {self.samples_read_at_stop} samples read; down for "
              f"{self.seconds:.0f} s", file=sys.stderr, flush=True)
        time.sleep(self.seconds)
        self.server.start()
        self.down_s = time.monotonic() - t0
        print(f"  baseline server answers again after {self.down_s:.0f} s", file=sys.stderr, flush=True)


class CommitAudit:
    """Measurement only (the service's own methods wrapped, behaviour unchanged): when each sample was
    handed to a baseline worker and when that worker finished it, and every offset commit -- so that
    samples committed before they were scored can be counted from outside the service's bookkeeping."""

    def __init__(self, svc: Any, position: dict[str, int]):
        self.position, self.selected, self.done = position, {}, {}
        self.commits: list[tuple[float, dict]] = []
        for w in svc.workers.values():
            self._wrap_worker(w)
        for name in ("commit", "commit_async"):
            if hasattr(svc.source, name):
                self._wrap_commit(svc.source, name)

    def _wrap_worker(self, w: Any) -> None:
        enqueue, work = w.enqueue, w._work

        def enqueue_(item: Any) -> None:
            self.selected[w.sample_of(item)["request_id"]] = time.monotonic()
            enqueue(item)

        def work_(item: Any) -> None:
            before = w.counts["done"]
            work(item)
            if w.counts["done"] > before:
                self.done[w.sample_of(item)["request_id"]] = time.monotonic()

        w.enqueue, w._work = enqueue_, work_

    def _wrap_commit(self, source: Any, name: str) -> None:
        commit = getattr(source, name)

        def commit_(offsets: dict, *a: Any, **kw: Any) -> Any:
            self.commits.append((time.monotonic(), {tp: o for tp, o in offsets.items()}))
            return commit(offsets, *a, **kw)

        setattr(source, name, commit_)

    def committed_unscored(self) -> int:
        """Selected samples below a committed offset before their worker finished (or never finished);
        one partition: a sample's offset is its stream position."""
        bad = set()
        for t, offsets in self.commits:
            top = max(offsets.values(), default=0)
            bad |= {rid for rid in self.selected if self.position.get(rid, 1 << 60) < top
                    and self.done.get(rid, float("inf")) > t}
        return len(bad)


def replay(stream: list[dict], source: str, baseline_url: str, vocab: int, workdir: Path, args: argparse.Namespace,
           broker: Any = None, outage: Outage | None = None) -> dict[str, Any]:
    """Run the sidecar's service over the whole stream; counters, alarms and the measured shift."""
    import threading

    from quality_sidecar.service import Service, ServiceConfig

    workdir.mkdir(parents=True, exist_ok=True)
    alerts = workdir / "alerts.jsonl"
    conf: dict[str, Any] = {"alerts": f"file://{alerts}", "progress": False, "baseline_url": baseline_url + "/v1",
                            "state_path": str(workdir / "state.json"), "max_samples": len(stream),
                            "conformance": {"vocab_size": vocab}, "baseline_dtype": args.dtype,
                            "replay_fraction": args.replay_fraction}
    if source == "file":
        path = workdir / "stream.jsonl"
        path.write_text("".join(json.dumps(s) + "\n" for s in stream))
        conf["source"] = f"file://{path}"
    else:
        from kafka import KafkaProducer

        topic = f"replay-{uuid.uuid4().hex[:8]}"
        broker.create_topic(topic)
        p = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=100, batch_size=1 << 20, acks="all",
                          max_request_size=8 << 20)
        for s in stream:
            p.send(topic, value=json.dumps(s).encode())
        p.flush(120)
        p.close()
        conf.update(source=f"kafka://{broker.bootstrap}/{topic}", group=f"replay-{uuid.uuid4().hex[:6]}")
    svc = Service(ServiceConfig.from_dict(conf), http_port=0)
    port, seen, paused = svc.http.port, {}, []
    close, backpressure = svc.close, svc._backpressure

    def close_after_scrape() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            seen["metrics"] = r.read().decode()
        close()

    def watch() -> bool:
        b = backpressure()
        paused.append(b)
        return b

    svc.close, svc._backpressure = close_after_scrape, watch
    position = {s["request_id"]: i for i, s in enumerate(stream)}
    audit = CommitAudit(svc, position)
    stopper = threading.Thread(target=outage.run, args=(svc,), daemon=True) if outage is not None else None
    t0 = time.time()
    if stopper is not None:
        stopper.start()
    svc.run()
    wall = time.time() - t0
    if stopper is not None:
        stopper.join()
    m = seen["metrics"]
    cand_before = [0]
    for s in stream:
        cand_before.append(cand_before[-1] + (s["deployment"]["arm"] == "candidate"))
    alarms = []
    for line in alerts.read_text().splitlines() if alerts.exists() else []:
        e = json.loads(line)
        last = position.get((e.get("example_request_ids") or [None])[-1])
        alarms.append({"detector": e["detector"], "arm": e["arm"],
                       "stream_position": last, "candidate_samples_read": None if last is None else cand_before[last + 1],
                       "pvalue": e.get("pvalue"), "statistic": e.get("statistic"),
                       "chart": (e.get("detail") or {}).get("chart")})
    pairs = svc.pipeline.charts.pairs.get(stream[0]["model"])  # T=0 exact match: per pair source, A/A and candidate
    exact = {src: dict(v) for src, v in pairs.detector.sources_.items()} if pairs is not None else None
    mon = svc.pipeline.charts.conformance.get(stream[0]["model"])
    shift = mon.shift() if mon is not None else (float("nan"),) * 3
    arms = {}
    for arm in ("baseline", "candidate"):
        sel = _metric(m, "quality_sidecar_conformance_selected_samples_total", arm=arm)
        scored = _metric(m, "quality_sidecar_conformance_scored_samples_total", arm=arm)
        arms[arm] = {"samples": sum(s["deployment"]["arm"] == arm for s in stream), "selected": sel,
                     "scored": scored, "scored_share": scored / sel if sel else None,
                     "failed": _metric(m, "quality_sidecar_baseline_failed_samples_total", arm=arm),
                     "impossible_tokens": _metric(m, "quality_sidecar_impossible_tokens_total", arm=arm)}
    charts = {arm: {"tokens": c.pit.tokens_, "mean_excess_nats_per_token": c.excess.mean_excess,
                    **({"late_draft_tokens": c.late.tokens_, "late_draft_mean_excess_nats_per_token": c.late.mean_excess}
                       if hasattr(c, "late") else {})}
              for arm, c in (mon.charts.items() if mon is not None else [])}
    return {"source": source, "wall_s": wall, "samples_read": svc.pipeline.counts["samples"], "charts": charts,
            "source_paused_checks": sum(paused), "arms": arms, "alarms": alarms, "exact_match": exact,
            "replay": dict(svc.replay.counts) if svc.replay is not None else None,
            "logprob_shift_nats_per_token": shift[0], "logprob_shift_ci95": [shift[1], shift[2]],
            "retries": svc.scorer.counts.get("retries", 0) if svc.scorer is not None else None,
            "commits": len(audit.commits), "selected_samples": len(audit.selected),
            "finished_samples": len(audit.done), "committed_unscored": audit.committed_unscored(),
            "outage": None if outage is None else {"samples_read_at_stop": outage.samples_read_at_stop,
                                                   "planned_s": outage.seconds, "down_s": outage.down_s}}


def first_alarm(run: dict[str, Any], detector: str = "sampling_conformance") -> int | None:
    """Candidate samples read when ``detector`` first alarmed on the candidate arm."""
    return min((a["candidate_samples_read"] for a in run["alarms"] if a["detector"] == detector
                and a["arm"] == "candidate" and a["candidate_samples_read"] is not None), default=None)


def outage_comparison(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stream: the Kafka run with the outage against the one without -- the first conformance alarm's
    position (candidate samples read) and its relative change, samples committed unscored, failed."""
    out = {}
    for r in runs:
        if r["outage"] is None:
            continue
        ref = next((x for x in runs if x["stream"] == r["stream"] and x["source"] == "kafka" and x["outage"] is None),
                   None)
        a, b = first_alarm(r), first_alarm(ref) if ref else None
        out[r["stream"]] = {"alarm_at_candidate_sample": {"outage": a, "no_outage": b},
                            "alarm_position_change": (a - b) / b if a is not None and b else None,
                            "committed_unscored": r["committed_unscored"],
                            "failed": sum(v["failed"] for v in r["arms"].values()),
                            "scored_equals_selected": all(v["scored"] == v["selected"] for v in r["arms"].values()),
                            "down_s": r["outage"]["down_s"]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model dir (default: the demo model)")
    ap.add_argument("--prompts", type=int, default=350, help="held-out open prompts")
    ap.add_argument("--samples-per-prompt", type=int, default=5)
    ap.add_argument("--samples", type=int, default=3000, help="samples in each stream")
    ap.add_argument("--lead", type=int, default=500, help="baseline-only samples at the start of a stream")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=32, help="max_num_seqs of the baseline arm's sampling engine")
    ap.add_argument("--candidate-batch", type=int, default=None,
                    help="max_num_seqs of the candidate arms' engines (default: --batch); another batch size "
                         "than the baseline's is what a bf16 deployment has, and what bf16 batch variance needs")
    ap.add_argument("--dtype", default="float32", help="dtype of every engine and of the baseline server "
                    "(float32, bfloat16); the samples record it (decoder.dtype)")
    ap.add_argument("--replay-fraction", type=float, default=0.1,
                    help="share of greedy samples replayed on the baseline server for exact_match (the sidecar's "
                         "replay_fraction; default 0.1, its default)")
    ap.add_argument("--sources", default="file,kafka", help="comma list of file, kafka")
    ap.add_argument("--streams", default="fault,control,exact", help=f"comma list of candidate arms ({', '.join(list(ARMS)[1:])})")
    ap.add_argument("--producer", choices=["rows", "telemetry"], default="rows",
                    help="rows: samples built from in-process generations; telemetry: every arm generated in a "
                         "process of its own through the plugin's producer (real samples, draft masks included)")
    ap.add_argument("--produce", nargs=3, metavar=("SPEC", "LABEL", "SINK"), help=argparse.SUPPRESS)
    ap.add_argument("--outage-s", type=float, default=0.0,
                    help="also replay each stream from Kafka with the baseline server stopped this many seconds "
                         "(then started again on its port), and compare with the run without the outage")
    ap.add_argument("--outage-at", type=int, default=None,
                    help="samples the sidecar has read when the server stops (default: --lead + 50; checked every "
                         "50 ms, records come in batches)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=".bench-work/replay")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    args.top_p, args.top_k = 1.0, 0
    args.candidate_batch = args.candidate_batch or args.batch
    if args.produce:
        produce(*args.produce, args)
        return 0

    sys.path.insert(0, str(Path(__file__).parent))
    from sidecar_conformance import generate

    from tests.support.vllm_server import VllmServer
    from vllm_lookahead.decoders import DEMO_MODEL
    from vllm_lookahead.prompts import load_heldout_prompts

    model = args.served_model = args.model or str(DEMO_MODEL)  # the producer names samples by the model path
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    prompts = load_heldout_prompts(args.prompts, "open", seed=7)
    n_cand = (args.samples - args.lead) // 2
    if args.prompts * args.samples_per_prompt < args.samples - n_cand:
        ap.error("--prompts x --samples-per-prompt must cover the baseline arm's samples")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    arm_samples: dict[str, list[dict]] = {}
    t_all = time.time()
    for name in ["none", *args.streams.split(",")]:
        key = hashlib.sha1(json.dumps([ARMS[name], args.prompts, args.samples_per_prompt, args.max_tokens,
                                       args.temperature, args.seed, model]
                                      + ([args.dtype, args.batch if name == "none" else args.candidate_batch]
                                         if (args.dtype, args.candidate_batch) != ("float32", args.batch) else [])
                                      ).encode()).hexdigest()[:12]
        label = "baseline" if name == "none" else "candidate"
        t0 = time.time()
        if args.producer == "rows":
            cache = work / f"{name}-{key}.json"
            if not cache.exists():
                batch = args.batch if name == "none" else args.candidate_batch
                cache.write_text(json.dumps(generate(model, ARMS[name], args.dtype, prompts,
                                                     argparse.Namespace(**{**vars(args), "batch": batch}))))
            rows = [r for r in json.loads(cache.read_text()) if r["output_ids"]]
            arm_samples[name] = samples_from_rows(rows, label, "none" if name == "none" else "lookahead", prompts,
                                                  args, start=0 if name == "none" else 10**6)
        else:
            cache = work / f"{name}-{key}.samples.jsonl"
            if not cache.exists():
                part = cache.with_suffix(".partial")
                part.unlink(missing_ok=True)
                cmd = [sys.executable, __file__, "--json", "-", "--prompts", str(args.prompts), "--samples-per-prompt",
                       str(args.samples_per_prompt), "--max-tokens", str(args.max_tokens), "--temperature",
                       str(args.temperature), "--batch", str(args.batch), "--seed", str(args.seed),
                       "--candidate-batch", str(args.candidate_batch), "--dtype", args.dtype,
                       *(["--model", args.model] if args.model else []), "--produce", ARMS[name], label, str(part)]
                subprocess.run(cmd, check=True)
                part.rename(cache)
            arm_samples[name] = [json.loads(x) for x in cache.read_text().splitlines()
                                 if (json.loads(x)["output"].get("token_ids"))]
        print(f"[{name}] {len(arm_samples[name])} samples ({time.time() - t0:.0f} s)", file=sys.stderr)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        server = VllmServer(model, env={}, workdir=tmp, args=[
            "--served-model-name", model, "--max-model-len", "1024", "--enforce-eager", "--dtype", args.dtype,
            "--seed", "0"]).start()
        broker = None
        try:
            if "kafka" in args.sources:
                from tests.support.kafka_broker import KafkaBroker

                (Path(tmp) / "kafka").mkdir()
                broker = KafkaBroker(Path(tmp) / "kafka").start()
            plan = [(source, None) for source in args.sources.split(",")]
            if args.outage_s > 0:
                plan.append(("kafka", Outage(server, args.outage_at or args.lead + 50, args.outage_s)))
            for name in args.streams.split(","):
                stream = build_stream(arm_samples["none"], arm_samples[name], args)
                for source, outage in plan:
                    tag = f"{name}-{source}" + ("-outage" if outage else "")
                    r = replay(stream, source, server.url, vocab, Path(tmp) / tag, args, broker, outage)
                    r["stream"], r["candidate_spec"] = name, ARMS[name]
                    runs.append(r)
                    first = {d: min((a["candidate_samples_read"] for a in r["alarms"]
                                     if a["detector"] == d and a["arm"] == "candidate"), default=None)
                             for d in CONFORMANCE_DETECTORS}
                    print(f"{name:6s} {source:6s}{' outage' if outage else ''} {r['samples_read']} samples in "
                          f"{r['wall_s']:.0f} s, committed unscored {r['committed_unscored']}, scored "
                          + ", ".join(f"{a} {v['scored']:.0f}/{v['selected']:.0f}" for a, v in r["arms"].items())
                          + f"; alarms {len(r['alarms'])}, first conformance alarm at candidate sample "
                          f"{first['sampling_conformance']}; shift {r['logprob_shift_nats_per_token']:+.3f} nat/token",
                          file=sys.stderr)
        finally:
            if broker is not None:
                broker.stop()
            server.stop()
    out = {"benchmark": "sidecar_replay",
           "command": shlex.join(["python", "benchmarks/sidecar_replay.py", *(sys.argv[1:] if argv is None else argv)]),
           "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": model,
           "sampler": {"temperature": args.temperature, "top_p": 1.0, "top_k": 0}, "samples": args.samples,
           "dtype": args.dtype, "batch": {"baseline": args.batch, "candidate": args.candidate_batch},
           "replay_fraction": args.replay_fraction,
           "producer": args.producer,
           "lead": args.lead, "max_tokens": args.max_tokens, "wall_s": time.time() - t_all, "runs": runs,
           "outage_vs_no_outage": outage_comparison(runs)}
    Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
