"""Run by test_telemetry_llm.py in a subprocess (telemetry installs process-wide hooks, so it gets a
process of its own): vllm.LLM in-process with ngram speculation, generate inside a caller's span.

    python llm_offline_app.py MODEL OUT.json

Three requests: greedy with a stop string (``output.stop_reason``), plain greedy, and n=2 sampled
(each choice reported on its own, ``sampling.n`` = 2, span ``gen_ai.request.choice.count`` = 2).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PROMPTS = ["def add(a, b):\n    return", "import os\nimport sys\nimport", "class Stack:\n    def"]

if __name__ == "__main__":
    model, out_path = sys.argv[1], sys.argv[2]
    from opentelemetry.sdk.trace import TracerProvider
    from vllm import LLM, SamplingParams

    from vllm_lookahead.telemetry.frontend import current
    from vllm_lookahead.vllm.frontend_patch import process_id_prefix

    llm = LLM(model, distributed_executor_backend="uni", max_model_len=512, seed=0, enforce_eager=True,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                  "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    params = [SamplingParams(max_tokens=16, temperature=0, stop=["\n"]),
              SamplingParams(max_tokens=16, temperature=0),
              SamplingParams(max_tokens=16, temperature=0.8, seed=1, n=2)]
    caller = TracerProvider().get_tracer("caller")  # the application's own span around the batch
    with caller.start_as_current_span("batch") as span:
        ctx = span.get_span_context()
        outs = llm.generate(PROMPTS, params)
    telemetry = current()
    assert telemetry is not None, "telemetry did not install from the plugin entry point"
    telemetry.shutdown(10)
    prefix = process_id_prefix()
    choices = []
    for o in outs:
        for c in o.outputs:
            vllm_id = o.request_id if len(o.outputs) == 1 else f"{o.request_id}#{c.index}"
            choices.append({"sample_id": prefix + vllm_id, "vllm_request_id": vllm_id,
                            "index": c.index, "n": len(o.outputs), "text": c.text,
                            "num_tokens": len(c.token_ids), "finish_reason": c.finish_reason,
                            "stop_reason": c.stop_reason,
                            "spec": c.spec_decode_metrics.to_dict() if c.spec_decode_metrics else None})
    Path(out_path).write_text(json.dumps({
        "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}", "id_prefix": prefix,
        "outputs": choices, "stats": telemetry.stats.snapshot(),
        "dtype": str(llm.llm_engine.model_config.dtype).removeprefix("torch."),
    }))
