"""The gate's HTTP engine: run an arm against a live OpenAI-compatible vLLM server.

Why a second engine: the in-process engine can only build CPU engines from decoder SPECs; a release
is also a vLLM upgrade, a dtype or kernel swap or a GPU deployment, none of which is a SPEC.  Over
HTTP the gate sees what users see: the same prompts go to the baseline and the candidate server and
come back as the same ``RequestRecord``s the in-process engine produces, so statistics and report
are shared.

What the endpoint must offer (vLLM's OpenAI server does; a plain OpenAI server does not):
``return_token_ids`` (the gate compares token ids, not text) and, for the T>0 check, ``prompt_logprobs``
(or ``echo`` + ``logprobs`` with ``return_tokens_as_token_ids``) on the *baseline* server, which scores
both arms' samples (``quality_sidecar.baseline_scoring.LogprobClient``).  Sampling parameters that vLLM
would otherwise take from the model's ``generation_config.json`` (top-k, top-p, min-p, repetition
penalty) are sent explicitly, so both arms sample from exactly the declared distribution.

Robustness: every request has a timeout; connection errors, timeouts, 429 and 5xx are retried with
exponential backoff; anything else that is not the expected JSON is *garbage* and stops the gate at
once.  Both end in ``EndpointError``; during a run it becomes ``RunCrashed`` naming the request and its
sampling profile (the candidate's: a FAIL verdict; the baseline's: CLI exit 2, no report).  Acceptance and compression
come from the server's Prometheus counters (``vllm:spec_decode_*``) read before and after each run (the
gate must own the endpoints while it runs; other traffic would be counted too).  Each token's draft
position (for the late-draft-position test) comes from vLLM's per-request ``metrics.speculative_decoding``
step lists, which a speculative server returns at the ``detailed`` level (``vllm-lookahead serve`` sets
it; a server without them leaves that test out).
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from quality_sidecar.workers import WorkFailed
from vllm_lookahead.gate.engine import ArmRuns, RequestRecord, RunCrashed, RunResult
from vllm_lookahead.gate.evalset import EvalItem
from vllm_lookahead.gate.inprocess_scoring import empty_score, score_dict
from vllm_lookahead.gate.profiles import SamplingProfile, profile_of, seeded

PROBE_PROMPT = "def add(a, b):\n    return"


class EndpointError(RuntimeError):
    """An endpoint is unreachable, too slow, or answered something that is not what the gate needs."""


@dataclass(frozen=True)
class EndpointOptions:
    """HTTP settings shared by both endpoints."""

    timeout_s: float = 120.0  # per request
    retries: int = 3  # extra attempts after the first, on connection errors / timeouts / 429 / 5xx
    backoff_s: float = 0.5  # first wait; doubled per attempt
    concurrency: int = 16  # requests in flight for the main (batched) runs
    api: str = "completions"  # completions | chat (chat needs a model with a chat template)
    top_logprobs: int = 20  # K for T>0 scoring on the baseline (vLLM's default --max-logprobs)

    def __post_init__(self) -> None:
        if self.api not in ("completions", "chat"):
            raise ValueError(f"api must be completions or chat, got {self.api!r}")
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0 or self.concurrency < 1:
            raise ValueError("need timeout_s > 0, retries >= 0, backoff_s >= 0, concurrency >= 1")


def _short(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


class EndpointClient:
    """One OpenAI-compatible server (``role`` is baseline or candidate, for messages)."""

    def __init__(self, role: str, url: str, model: str | None, opts: EndpointOptions):
        if not url.startswith(("http://", "https://")):
            raise EndpointError(f"{role} URL {url!r} must start with http:// or https://")
        self.role, self.url, self.model, self.opts = role, url.rstrip("/"), model, opts
        self._local = threading.local()
        self.version: str | None = None

    def _session(self) -> Any:
        import requests

        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, *, raw: bool = False) -> Any:
        """JSON (or text with ``raw``) of one call, with retries; ``EndpointError`` when it cannot be had."""
        import requests

        last = ""
        for attempt in range(self.opts.retries + 1):
            if attempt:
                time.sleep(self.opts.backoff_s * 2 ** (attempt - 1))
            try:
                r = self._session().request(method, self.url + path, json=body, timeout=self.opts.timeout_s)
            except requests.Timeout:
                last = f"no answer within {self.opts.timeout_s:g} s"
                continue
            except requests.ConnectionError as e:
                last = f"unreachable ({_short(str(e.__cause__ or e), 160)})"
                continue
            except requests.RequestException as e:  # a broken or truncated answer: retried, then garbage
                last = f"broken answer ({type(e).__name__}: {_short(str(e), 160)})"
                continue
            if r.status_code == 429 or r.status_code >= 500:
                last = f"HTTP {r.status_code}: {_short(r.text)}"
                continue
            if r.status_code >= 400:
                raise EndpointError(f"{self.role} endpoint {self.url}{path} rejected the request "
                                    f"(HTTP {r.status_code}): {_short(r.text, 400)}")
            if raw:
                return r.text
            try:
                return r.json()
            except ValueError:
                raise EndpointError(f"{self.role} endpoint {self.url}{path} returned garbage (not JSON): "
                                    f"{_short(r.text)!r}") from None
        raise EndpointError(f"{self.role} endpoint {self.url}{path}: {last} "
                            f"(gave up after {self.opts.retries + 1} attempts)")

    def server_version(self) -> str | None:
        """vLLM's ``/version`` (None for servers without it)."""
        try:
            return str(self.request("GET", "/version").get("version"))
        except (EndpointError, AttributeError):
            return None

    def served_models(self) -> list[str]:
        data = self.request("GET", "/v1/models")
        try:
            return [str(m["id"]) for m in data["data"]]
        except (KeyError, TypeError):
            raise EndpointError(f"{self.role} endpoint {self.url}/v1/models returned garbage: "
                                f"{_short(str(data))!r}") from None

    def resolve_model(self) -> str:
        """The served model to use: ``--model`` if given (must be served), else the only/first one."""
        models = self.served_models()
        if not models:
            raise EndpointError(f"{self.role} endpoint {self.url} serves no model")
        if self.model is None:
            self.model = models[0]
        elif self.model not in models:
            raise EndpointError(f"{self.role} endpoint {self.url} does not serve model {self.model!r} "
                                f"(it serves {models})")
        return self.model

    def generate(self, prompt: str, max_tokens: int, temperature: float = 0.0,
                 sampling: dict[str, Any] | None = None) -> tuple[dict[str, Any], float]:
        """One sample: ({token_ids, text, finish_reason, prompt_token_ids}, wall seconds).  ``sampling``
        (a profile's ``request_fields``) replaces the plain ``temperature`` sampler."""
        body: dict[str, Any] = {
            "model": self.model, "max_tokens": max_tokens, "temperature": temperature, "n": 1,
            "return_token_ids": True,
            # vLLM would fill these from generation_config.json: state the sampler exactly
            "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, **(sampling or {})}
        if self.opts.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = prompt
            path = "/v1/completions"
        t0 = time.perf_counter()
        data = self.request("POST", path, body)
        wall = time.perf_counter() - t0
        try:
            c = data["choices"][0]
            text = c["message"]["content"] if self.opts.api == "chat" else c["text"]
            out = {"token_ids": [int(t) for t in c["token_ids"]], "text": text or "",
                   "finish_reason": c.get("finish_reason"),
                   "prompt_token_ids": [int(t) for t in (c.get("prompt_token_ids") or data.get("prompt_token_ids"))]}
            # vLLM's per-request speculative metrics (a speculative server at the `detailed` level, which
            # `vllm-lookahead serve` sets): the per-step lists give each token's draft position
            sd = (data.get("metrics") or {}).get("speculative_decoding") or {}
            if sd.get("per_step_drafted") is not None and sd.get("per_step_accepted") is not None:
                out["spec"] = {"drafted": int(sd["num_draft_tokens"]), "accepted": int(sd["num_accepted_draft_tokens"]),
                               "per_step_drafted": [int(x) for x in sd["per_step_drafted"]],
                               "per_step_accepted": [int(x) for x in sd["per_step_accepted"]]}
        except (KeyError, IndexError, TypeError, ValueError):
            raise EndpointError(
                f"{self.role} endpoint {self.url}{path} returned garbage or no token ids (the gate needs vLLM's "
                f"return_token_ids extension): {_short(str(data))!r}") from None
        return out, wall

    def spec_counters(self) -> dict[str, Any]:
        """vLLM's ``vllm:spec_decode_*`` counters from /metrics (names as the in-process engine reports
        them: ``_total`` dropped; per-position counts as a list).  Empty when the server has none."""
        try:
            text = self.request("GET", "/metrics", raw=True)
        except EndpointError:
            return {}
        out: dict[str, Any] = {}
        per_pos: dict[int, float] = {}
        for line in text.splitlines():
            if not line.startswith("vllm:spec_decode_"):
                continue
            key, _, value = line.rpartition(" ")
            name, _, labels = key.partition("{")
            name = name.removeprefix("vllm:spec_decode_").removesuffix("_total")
            if name.endswith("_created"):
                continue
            v = float(value)
            if name == "num_accepted_tokens_per_pos":
                pos = labels.split('position="', 1)[1].split('"', 1)[0] if 'position="' in labels else "0"
                per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + v
            else:
                out[name] = out.get(name, 0.0) + v
        if per_pos:
            out["num_accepted_tokens_per_pos"] = [per_pos[i] for i in sorted(per_pos)]
        return out


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in after.items():
        b = before.get(k)
        if isinstance(v, list):
            out[k] = [x - (b[i] if isinstance(b, list) and i < len(b) else 0) for i, x in enumerate(v)]
        else:
            out[k] = v - (b or 0)
    return out


class HttpEngine:
    """The gate's view of one endpoint: the same runs as ``engine.run_arm``, over HTTP."""

    def __init__(self, client: EndpointClient, default_max_tokens: int = 48, seed: int = 0):
        self.client, self.default_max_tokens, self.seed = client, default_max_tokens, seed

    def describe(self) -> dict[str, Any]:
        return {"spec": f"{self.client.url} ({self.client.model})", "kind": "endpoint", "url": self.client.url,
                "model": self.client.model, "api": self.client.opts.api,
                "server_version": self.client.version, "k": None, "params": {}, "class": None}

    def run(self, name: str, items: list[EvalItem], *, concurrency: int,
            profiles: list[SamplingProfile] | None = None, samples: int = 1,
            progress: Callable[[str], None] | None = None) -> RunResult:
        """Every item (x samples) with ``concurrency`` requests in flight; records in job order
        (sample-major, like the in-process batch).  Greedy without ``profiles``."""
        jobs = [(it, s) for s in range(samples) for it in items]
        before = self.client.spec_counters()

        def one(j: int) -> RequestRecord:
            it, s = jobs[j]
            prof = profile_of(profiles, s) if profiles else None
            fields = prof.request_fields(it.id, s, self.seed) if prof else None
            try:
                out, wall = self.client.generate(it.prompt, it.max_tokens or self.default_max_tokens, sampling=fields)
            except EndpointError as e:  # retries spent: the endpoint died under this request
                raise RunCrashed(name, e, [(it.id, j % len(items), s)], prof) from e
            n = len(out["token_ids"])
            rec = RequestRecord(it.id, s, out["token_ids"], out["text"], out["finish_reason"],
                                len(out["prompt_token_ids"]), tpot_s=wall / n if n else None,
                                prompt_token_ids=out["prompt_token_ids"], latency_s=wall, **out.get("spec", {}))
            rec.steps = max(0, n - rec.accepted)
            return rec

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=min(concurrency, max(1, len(jobs)))) as pool:
            futures = [pool.submit(one, j) for j in range(len(jobs))]
            try:
                recs = [f.result() for f in futures]
            except RunCrashed:  # a dead endpoint: do not retry every queued request against it
                for f in futures:
                    f.cancel()
                raise
        wall = time.perf_counter() - t0
        if progress:
            progress(f"{name}: {len(recs)} requests at concurrency {concurrency} in {wall:.1f} s")
        mode = "batch" if concurrency >= len(jobs) else ("sequential" if concurrency == 1
                                                          else f"concurrency {concurrency}")
        return RunResult(name, self.describe(), mode, [p.to_json() for p in profiles or []], self.seed, wall, recs,
                         _delta(before, self.client.spec_counters()))

    def run_arm(self, items: list[EvalItem], *, name: str, sequential_items: list[EvalItem] | None,
                samples: int = 0, profiles: list[SamplingProfile] | None = None, aa_batch_size: int | None = None,
                concurrency: int = 16, progress: Callable[[str], None] | None = None) -> ArmRuns:
        """Greedy at ``concurrency``; the A/A partner (baseline: every item again at ``aa_batch_size``
        in flight, another batch composition on the server); the batch-1 latency subset one at a time;
        the T>0 samples (baseline, per-request seeds: again at ``aa_batch_size`` in flight)."""
        greedy = self.run(name, items, concurrency=concurrency, progress=progress)
        aa = (self.run(f"{name} A/A", items, concurrency=aa_batch_size, progress=progress)
              if aa_batch_size else None)
        seq = (self.run(f"{name} latency", sequential_items, concurrency=1, progress=progress)
               if sequential_items else None)
        sampled = (self.run(f"{name} T>0", items, concurrency=concurrency, profiles=profiles,
                            samples=samples, progress=progress) if samples > 0 and profiles else None)
        # per-request seeds: the samples again at another concurrency (the seeded A/A partner)
        sampled_aa = (self.run(f"{name} T>0 A/A", items, concurrency=aa_batch_size, profiles=profiles,
                               samples=samples, progress=progress)
                      if sampled is not None and aa_batch_size and seeded(profiles) else None)
        return ArmRuns(greedy, seq, sampled, 0.0, aa, sampled_aa)


class _RetryingLogprobClient:
    """``quality_sidecar.baseline_scoring.LogprobClient`` whose POSTs go through the gate's retrying client."""

    def __new__(cls, client: EndpointClient) -> Any:
        from quality_sidecar.baseline_scoring import LogprobClient

        class _Client(LogprobClient):
            def _post(self, body: dict[str, Any]) -> dict[str, Any]:
                return client.request("POST", "/v1/completions", body)

        return _Client(client.url, model=client.model, top_logprobs=client.opts.top_logprobs,
                       timeout_s=client.opts.timeout_s, api="auto")


class HttpScorer:
    """Score T>0 samples of both arms under the *baseline endpoint*: its top-K log-probs of every
    output position (``LogprobClient``), turned into PIT values and token log-probs by
    ``score_topk`` -- exact by coarsening, see ``quality_sidecar.detectors.conformance_scoring``."""

    def __init__(self, client: EndpointClient, seed: int = 0, concurrency: int = 8):
        self.client, self.seed, self.concurrency = client, seed, concurrency

    def check(self) -> None:
        """Fail before any run if the baseline cannot return prompt log-probs."""
        out, _ = self.client.generate(PROBE_PROMPT, 2, 0.0)
        lp = _RetryingLogprobClient(self.client)
        try:
            lp.score(out["prompt_token_ids"], out["token_ids"])
        except (RuntimeError, WorkFailed) as e:
            raise EndpointError(f"baseline endpoint {self.client.url} cannot score T>0 samples ({e}); "
                                "set criteria.sampled.samples_per_item: 0 and required: false to gate without "
                                "the T>0 check") from None

    def score(self, runs: list[RunResult]) -> float:
        """Each record under the sampler of its own profile (``run.sampling``)."""
        from quality_sidecar.detectors.conformance_scoring import score_topk

        lp = _RetryingLogprobClient(self.client)
        t_all = time.perf_counter()
        for run in runs:
            t0 = time.perf_counter()
            rng = np.random.default_rng([self.seed, zlib.crc32(run.name.encode())])

            def fetch(r: RequestRecord, sampling: list[dict[str, Any]] = run.sampling) -> Any:
                if not r.token_ids:
                    return None
                try:
                    return lp.score(r.prompt_token_ids, r.token_ids, top_k=profile_of(sampling, r.sample).top_k)
                except (RuntimeError, WorkFailed) as e:
                    if isinstance(e, EndpointError):
                        raise
                    raise EndpointError(f"baseline endpoint {self.client.url}: scoring failed: {e}") from None

            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                rows = list(pool.map(fetch, run.records))
            scores = []
            for r, row in zip(run.records, rows):  # in record order: the PIT draws do not depend on timing
                if row is None:
                    scores.append(empty_score(r.item_id, r.sample))
                    continue
                ids, lps, tok = row
                sc = score_topk(ids, lps, r.token_ids, tok, profile_of(run.sampling, r.sample).sampler(), rng)
                scores.append(score_dict(r.item_id, r.sample, sc, r.draft_positions))
            run.scores = scores
            run.scoring_s = time.perf_counter() - t0
        return time.perf_counter() - t_all


def probe(baseline: EndpointClient, candidate: EndpointClient) -> dict[str, Any]:
    """Preflight both endpoints: served model, token ids returned, one tokenizer.  Seconds, not minutes."""
    info: dict[str, Any] = {}
    outs = {}
    for c in (baseline, candidate):
        c.resolve_model()
        outs[c.role], _ = c.generate(PROBE_PROMPT, 2, 0.0)
        c.version = c.server_version()
        info[c.role] = {"url": c.url, "model": c.model, "server_version": c.version}
    if outs["baseline"]["prompt_token_ids"] != outs["candidate"]["prompt_token_ids"]:
        raise EndpointError("baseline and candidate tokenize the same prompt differently: the gate compares "
                            "token ids and needs one tokenizer (same model family) on both endpoints")
    return info
