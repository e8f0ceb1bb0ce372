"""Run by test_telemetry_llm.py in a subprocess (telemetry installs process-wide hooks, so it gets a
process of its own): vllm.LLM in-process with ngram speculation, generate inside a caller's span.

    python llm_offline_app.py MODEL OUT.json
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

    llm = LLM(model, distributed_executor_backend="uni", max_model_len=512, seed=0, enforce_eager=True,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                  "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    caller = TracerProvider().get_tracer("caller")  # the application's own span around the batch
    with caller.start_as_current_span("batch") as span:
        ctx = span.get_span_context()
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0))
    telemetry = current()
    assert telemetry is not None, "telemetry did not install from the plugin entry point"
    telemetry.shutdown(10)
    Path(out_path).write_text(json.dumps({
        "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
        "outputs": [{"request_id": o.request_id, "text": o.outputs[0].text,
                     "num_tokens": len(o.outputs[0].token_ids),
                     "spec": (o.outputs[0].spec_decode_metrics.to_dict()
                              if o.outputs[0].spec_decode_metrics else None)} for o in outs],
        "stats": telemetry.stats.snapshot(),
    }))
