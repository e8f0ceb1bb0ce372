"""Seeded T>0 requests through the OpenAI client: lookahead's tokens against a plain server's, token for token.

Why: vLLM promises that a request with a ``seed`` gives the same tokens whenever it is sent again.  With
coupled verification (``vllm_lookahead/vllm/coupled_verify.py``) a lookahead server keeps that promise *and*
gives the tokens the plain server gives.  This sends ``--n`` seeded requests, cycling through sampling
profiles (temperatures 0.7 / 1.0 / 1.3, top-p, top-k, min-p, the three penalties, logit bias, a JSON
schema), to ``vllm-lookahead serve`` without speculation and with the default lookahead decoder, the same
requests in the same order at ``--concurrency`` (so batches mix profiles), then sends a share of them
again to the lookahead server, in a different order, and compares:

* ``identical_to_plain``: per request, lookahead's token ids == the plain server's (same seed);
* ``reproduced``: the repeated requests' token ids == their first answer on the same server;
* the plain server's own reproduction of the same repeated requests (the A/A rate: a mismatch there is
  vLLM's own, not lookahead's).

    python benchmarks/seeded_exact.py --n 2000 --json benchmarks/results/seeded_exact_2000.json

Writes the command, per profile the counts, every mismatch (request, profile, first differing position),
the drafted-token counters of the lookahead server (drafts were verified, so the comparison is not
vacuous) and the machine.  Exit 1 if any request failed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vllm_lookahead.bench import code_version, machine  # noqa: E402 (after the path set-up)
from vllm_lookahead.decoders import DEFAULT_DECODER, parse_spec  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
          "required": ["name", "count"]}


def profiles(colon: int) -> dict[str, dict[str, Any]]:
    """Sampling profiles, each a request body without prompt and seed (``colon``: a token id to bias)."""
    return {
        "t0.7": {"temperature": 0.7},
        "t1.0": {"temperature": 1.0},
        "t1.3": {"temperature": 1.3},
        "top_p": {"temperature": 1.0, "top_p": 0.9},
        "top_k": {"temperature": 1.0, "top_k": 20},
        "min_p": {"temperature": 0.9, "min_p": 0.1},
        "penalties": {"temperature": 0.9, "presence_penalty": 0.5, "frequency_penalty": 0.3,
                      "repetition_penalty": 1.1},
        "logit_bias": {"temperature": 0.9, "logit_bias": {str(colon): 3.0}},
        "json_schema": {"temperature": 0.8, "structured_outputs": {"json": SCHEMA}},
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="benchmarks/seeded_exact.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model directory (default: the bundled demo model)")
    ap.add_argument("--prompts", default="mixed", help="open | copy | mixed (held-out stdlib test/ code) or a JSONL file")
    ap.add_argument("--n", type=int, default=2000, help="seeded requests (default 2000)")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens per request, at most (default 64)")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight per server (default 8)")
    ap.add_argument("--repeat-share", type=float, default=0.1,
                    help="share of the requests sent again to both servers, shuffled (default 0.1)")
    ap.add_argument("--decoder", default=DEFAULT_DECODER, help=f"the lookahead SPEC (default {DEFAULT_DECODER})")
    ap.add_argument("--seed", type=int, default=0, help="prompt selection, request seeds and order (default 0)")
    ap.add_argument("--json", type=Path, default=None, help="write the results JSON here")
    return ap


def send_all(url: str, model: str, bodies: list[dict[str, Any]], concurrency: int, desc: str) -> list[dict]:
    """Every body through the OpenAI client (completions), ``concurrency`` at a time: per body its token
    ids and finish reason, or the error."""
    from openai import OpenAI
    from tqdm import tqdm

    client = OpenAI(base_url=url + "/v1", api_key="unused", timeout=600, max_retries=0)
    std = {"prompt", "max_tokens", "temperature", "top_p", "seed", "logit_bias"}

    def one(body: dict[str, Any]) -> dict[str, Any]:
        try:
            extra = {k: v for k, v in body.items() if k not in std}
            r = client.completions.create(model=model, **{k: v for k, v in body.items() if k in std},
                                          extra_body={**extra, "return_token_ids": True})
            choice = r.choices[0]
            return {"token_ids": list((choice.model_extra or {}).get("token_ids") or []),
                    "finish_reason": choice.finish_reason}
        except Exception as e:  # noqa: BLE001 (recorded per request; the run goes on)
            return {"error": f"{type(e).__name__}: {e}"[:300]}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(tqdm(pool.map(one, bodies), total=len(bodies), desc=desc, unit="req"))


def counter(metrics_text: str, name: str) -> float:
    """A Prometheus counter's value summed over its label sets."""
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in metrics_text.splitlines() if ln.startswith(name))


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import requests

    from tests.support.vllm_server import VllmServer
    from vllm_lookahead.bench import load_prompts
    from vllm_lookahead.decoders import DEMO_MODEL

    model = args.model or str(DEMO_MODEL)
    spec = parse_spec(args.decoder)
    prompts = load_prompts(args.prompts, args.n, args.seed)
    if len(prompts) < args.n:
        print(f"seeded_exact: {len(prompts)} prompts, --n {args.n} wanted", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="seeded_exact-"))
    servers = {"plain": [], "lookahead": [f"--{k.replace('_', '-')}={json.dumps(v)}" for k, v in spec.engine_kwargs().items()]}
    answers: dict[str, list[dict]] = {}
    repeats: dict[str, list[dict]] = {}
    drafted = accepted = None
    names: list[str] = []
    table: dict[str, dict[str, Any]] = {}
    bodies: list[dict[str, Any]] = []
    again: list[int] = []
    t0 = time.time()
    for name, extra in servers.items():
        (work / name).mkdir()
        server = VllmServer(model, {}, ["--max-model-len", "2048", "--seed", str(args.seed), *extra],
                            str(work / name)).start()
        try:
            if not bodies:  # the profiles need a token id of this model: ask the server's tokenizer
                colon = requests.post(server.url + "/tokenize", json={"model": model, "prompt": ":"},
                                      timeout=60).json()["tokens"][-1]
                table = profiles(colon)
                names = [list(table)[i % len(table)] for i in range(args.n)]
                bodies = [{"prompt": p, "max_tokens": args.max_tokens, "seed": args.seed * 1_000_003 + i, **table[nm]}
                          for i, (p, nm) in enumerate(zip(prompts, names))]
                again = rng.sample(range(args.n), max(1, int(args.repeat_share * args.n)))
            answers[name] = send_all(server.url, model, bodies, args.concurrency, name)
            repeats[name] = send_all(server.url, model, [bodies[i] for i in again], args.concurrency, name + " again")
            if name == "lookahead":
                text = requests.get(server.url + "/metrics", timeout=10).text
                drafted, accepted = (counter(text, "vllm:spec_decode_num_draft_tokens_total"),
                                     counter(text, "vllm:spec_decode_num_accepted_tokens_total"))
        finally:
            server.stop()
    per_profile: dict[str, dict[str, int]] = {}
    mismatches, failed = [], 0
    for i, nm in enumerate(names):
        a, b = answers["plain"][i], answers["lookahead"][i]
        row = per_profile.setdefault(nm, {"requests": 0, "identical_to_plain": 0, "failed": 0})
        row["requests"] += 1
        if "error" in a or "error" in b:
            row["failed"] += 1
            failed += 1
            mismatches.append({"request": i, "profile": nm, "error": a.get("error") or b.get("error")})
            continue
        if a["token_ids"] == b["token_ids"]:
            row["identical_to_plain"] += 1
        else:
            mismatches.append({"request": i, "profile": nm, "first_difference": first_difference(a["token_ids"], b["token_ids"]),
                               "tokens": [len(a["token_ids"]), len(b["token_ids"])]})
    repro = {name: sum(1 for j, i in enumerate(again) if "error" not in repeats[name][j]
                       and repeats[name][j].get("token_ids") == answers[name][i].get("token_ids"))
             for name in servers}
    total_ok = sum(r["identical_to_plain"] for r in per_profile.values())
    out = {"command": "python benchmarks/seeded_exact.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "model": model, "prompts": args.prompts, "requests": args.n, "max_tokens": args.max_tokens,
           "concurrency": args.concurrency, "decoder": spec.text, "client": "openai (completions, return_token_ids)",
           "profiles": table,
           "dtype": "float32", "identical_to_plain": total_ok, "identical_to_plain_rate": total_ok / args.n,
           "failed": failed, "per_profile": per_profile, "repeated_requests": len(again),
           "reproduced": {"lookahead": repro["lookahead"], "plain (A/A)": repro["plain"]},
           "lookahead_draft_tokens": drafted, "lookahead_accepted_tokens": accepted,
           "output_tokens_plain": sum(len(a.get("token_ids") or []) for a in answers["plain"]),
           "mismatches": mismatches, "wall_s": round(time.time() - t0, 1), "machine": machine(),
           "code": code_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(f"identical to the plain server: {total_ok} of {args.n} seeded requests ({100 * total_ok / args.n:.2f}%); "
          f"repeated {len(again)}: lookahead reproduced {repro['lookahead']}, plain {repro['plain']}; "
          f"lookahead drafted {drafted} tokens, {accepted} accepted; {failed} failed")
    for nm, row in per_profile.items():
        print(f"  {nm:<12} {row['identical_to_plain']:>5} / {row['requests']} identical, {row['failed']} failed")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"[seeded_exact] wrote {args.json}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
