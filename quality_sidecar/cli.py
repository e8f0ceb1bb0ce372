"""``quality-sidecar``: run the monitoring service, or score a JSONL file once.

    quality-sidecar run --source kafka://HOST:PORT/TOPIC --group GROUP --dlq kafka://HOST:PORT/TOPIC \\
        --alerts kafka://HOST:PORT/TOPIC --http-port 9400 --config sidecar.yaml
    quality-sidecar run --source file://samples.jsonl --dlq file://dlq.jsonl
    quality-sidecar score --input samples.jsonl --json report.json
    quality-sidecar alarms list|ack DETECTOR|clear|rebaseline --url http://HOST:9400 [--model M --arm A]

Every ``run`` flag also reads ``QUALITY_SIDECAR_<FLAG>`` (``--http-port`` -> QUALITY_SIDECAR_HTTP_PORT);
the command line wins over the environment, which wins over ``--config``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

RUN_FLAGS = {  # flag -> (config key, type, help)
    "source": ("source", str, "kafka://HOST:PORT[,HOST:PORT]/TOPIC or file://PATH.jsonl"),
    "group": ("group", str, "Kafka consumer group (default quality-sidecar)"),
    "dlq": ("dlq", str, "dead-letter sink: kafka://HOST:PORT/TOPIC or file://PATH.jsonl"),
    "alerts": ("alerts", str, "alert events sink: kafka://HOST:PORT/TOPIC or file://PATH.jsonl"),
    "http-port": ("http_port", int, "port for /metrics /healthz /readyz (default 9400; -1 = off)"),
    "config": ("config", str, "YAML config (keys of ServiceConfig, detector knobs under 'monitor:')"),
    "baseline-url": ("baseline_url", str, "vLLM server without speculation (http://host:8000 or .../v1): greedy "
                                          "prompts are replayed against it, T>0 outputs scored under it"),
    "baseline-dtype": ("baseline_dtype", str, "the baseline server's --dtype (float32, bfloat16, ...): greedy "
                                              "samples served at another dtype are not replayed (dtype_mismatch)"),
    "webhook-url": ("webhook_url", str, "POST alert events as JSON to this URL"),
    "state": ("state_path", str, "state file: exactly-once counts across restarts (see docs/sidecar.md)"),
    "reference": ("reference_path", str, "JSONL of reference samples (frozen reference window)"),
    "max-samples": ("max_samples", int, "stop after this many valid samples, once their scoring is done (tests, benchmarks)"),
}


def _env(flag: str) -> str | None:
    return os.environ.get("QUALITY_SIDECAR_" + flag.upper().replace("-", "_"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quality-sidecar", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="consume samples, classify, detect drift, export metrics and alerts")
    for flag, (_key, typ, hlp) in RUN_FLAGS.items():
        run.add_argument(f"--{flag}", type=typ, default=None, help=f"{hlp} [env QUALITY_SIDECAR_{flag.upper().replace('-', '_')}]")
    run.add_argument("--no-progress", action="store_true", help="no progress bar for file sources")
    score = sub.add_parser("score", help="score a JSONL file once and write a JSON report")
    score.add_argument("--input", required=True, help="samples JSONL")
    score.add_argument("--json", required=True, help="output report path")
    score.add_argument("--dlq", default=None, help="file://PATH.jsonl for invalid lines (default: count only)")
    score.add_argument("--config", default=None, help="YAML config as for run")
    score.add_argument("--permutations", type=int, default=200, help="permutations for the text MMD test")
    score.add_argument("--baseline-url", default=None,
                       help="OpenAI-compatible baseline server: score every T>0 sample under it (PIT per arm, "
                            "likelihood shift between arms); without it T>0 conformance is not tested")
    score.add_argument("--text-embedder", default=None,
                       help="text vectors for the MMD test: hashed (default) | minilm (extra 'embeddings') | "
                            "pkg.module:Class (overrides monitor.text_embedder of --config)")
    al = sub.add_parser("alarms", help="list, acknowledge or clear the alarms of a running sidecar; re-baseline it")
    al.add_argument("action", choices=["list", "ack", "clear", "rebaseline"],
                    help="list: latched alarms; ack DETECTOR: acknowledge (restart) one detector; clear: "
                         "acknowledge all; rebaseline: the next samples become the new reference")
    al.add_argument("detector", nargs="?", default=None, help="detector name for 'ack' (e.g. refusal, exact_match)")
    al.add_argument("--url", default=None, help="sidecar HTTP base URL [env QUALITY_SIDECAR_URL, default "
                                                "http://127.0.0.1:9400]")
    al.add_argument("--model", default=None, help="only this model")
    al.add_argument("--arm", default=None, help="only this arm (baseline | candidate)")
    al.add_argument("--by", default=os.environ.get("USER"), help="who acknowledges (recorded in the event)")
    return p


def cmd_alarms(args: argparse.Namespace) -> int:
    """Talk to the HTTP control endpoints of a running sidecar (so no state file is edited by hand)."""
    import urllib.error
    import urllib.parse
    import urllib.request

    base = (args.url or os.environ.get("QUALITY_SIDECAR_URL") or "http://127.0.0.1:9400").rstrip("/")
    if args.action == "ack" and not args.detector:
        print("error: 'alarms ack' needs a DETECTOR (see 'alarms list'); 'alarms clear' acknowledges all",
              file=sys.stderr)
        return 2
    query = urllib.parse.urlencode({k: v for k, v in (("model", args.model), ("arm", args.arm), ("by", args.by))
                                    if v})
    path = {"list": "/alarms", "ack": f"/alarms/{urllib.parse.quote(args.detector or '', safe='')}/ack",
            "clear": "/alarms/clear", "rebaseline": "/rebaseline"}[args.action]
    req = urllib.request.Request(base + path + (f"?{query}" if query and args.action != "list" else ""),
                                 method="GET" if args.action == "list" else "POST", data=None)
    token = os.environ.get("QUALITY_SIDECAR_CONTROL_TOKEN")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        print(f"error: {e.code} {e.read().decode(errors='replace').strip()}", file=sys.stderr)
        return 1
    except urllib.error.URLError as e:
        print(f"error: cannot reach the sidecar at {base}: {e.reason}", file=sys.stderr)
        return 2
    if args.action == "list":
        alarms = [a for a in body["alarms"] if args.model in (None, a["model"]) and args.arm in (None, a["arm"])]
        for a in alarms:
            print(f"{a['detector']}\t{a['model']}\t{a['arm']}\tstatistic={a['statistic']:.4g}\t"
                  f"threshold={a['threshold']:.4g}")
        print(f"{len(alarms)} active alarm(s)", file=sys.stderr)
    else:
        print(json.dumps(body, indent=2))
    return 0


def load_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a YAML mapping")
    return data


def cmd_run(args: argparse.Namespace) -> int:
    from .service import Service, ServiceConfig

    values: dict[str, Any] = {}
    for flag, (key, typ, _h) in RUN_FLAGS.items():
        v = getattr(args, flag.replace("-", "_"))
        if v is None and _env(flag) is not None:
            v = typ(_env(flag))
        values[key] = v
    conf = load_config(values.pop("config"))
    http_port = values.pop("http_port")
    http_port = int(conf.pop("http_port", 9400)) if http_port is None else http_port
    conf.update({k: v for k, v in values.items() if v is not None})
    if not conf.get("source"):
        print("error: --source (or QUALITY_SIDECAR_SOURCE) is required, e.g. --source file://samples.jsonl",
              file=sys.stderr)
        return 2
    conf["progress"] = not args.no_progress and conf.get("progress", True)
    cfg = ServiceConfig.from_dict(conf)
    svc = Service(cfg, http_port=None if http_port < 0 else http_port)
    rc = svc.run()
    c = svc.pipeline.counts
    print(f"processed {c['samples']} samples, {c['dlq']} to the DLQ, {c['duplicates']} duplicates dropped, "
          f"{len(svc.pipeline.alarm_log)} alarms", file=sys.stderr)
    return rc


def cmd_score(args: argparse.Namespace) -> int:
    from .offline import score_file

    conf = load_config(args.config)
    if args.text_embedder:
        conf = {**conf, "monitor": {**(conf.get("monitor") or {}), "text_embedder": args.text_embedder}}
    report = score_file(args.input, conf, dlq=args.dlq, permutations=args.permutations,
                        baseline_url=args.baseline_url)
    Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    c = report["counts"]
    print(f"scored {c['samples']} samples ({c['dlq']} invalid) -> {args.json}", file=sys.stderr)
    for arm, a in report["exact_checks"]["arms"].items():
        if a["samples_checked"]:
            bad = sum(a["impossible_tokens"].values())
            print(f"exact checks, {arm}: {a['samples_checked']} samples, {a['positions_checked']} output tokens checked, "
                  f"{bad} impossible tokens" + (" (ALARM)" if a.get("impossible_alarm") else ""), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return {"run": cmd_run, "score": cmd_score, "alarms": cmd_alarms}[args.cmd](args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
