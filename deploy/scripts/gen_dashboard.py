"""Generate the chart's Grafana dashboard: APM panels (left) and quality panels (right), side by side.

Why generated: a hand-edited dashboard JSON drifts (duplicate ids, overlapping grid positions,
metric-name typos).  The panel list here is short and reviewable; the test suite checks that the
committed JSON equals this script's output, so edit here and run
``python deploy/scripts/gen_dashboard.py`` to refresh
``deploy/helm/vllm-lookahead/dashboards/vllm-lookahead.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

OUT = (
    Path(__file__).resolve().parents[1]
    / "helm"
    / "vllm-lookahead"
    / "dashboards"
    / "vllm-lookahead.json"
)
SEL = 'namespace=~"$namespace"'
# Rate windows are Grafana's $__rate_interval (max(4 x scrape interval, step + scrape interval)):
# a fixed [1m] holds two samples at a 30 s scrape and draws gaps.  The namespace variable takes its
# values from vLLM's series as well as the sidecar's, so the APM panels work with the sidecar off.
NAMESPACE_QUERY = (
    'label_values({__name__=~"vllm:num_requests_running|quality_sidecar_samples_total"}, namespace)'
)

# (title, unit, [(legend, PromQL)]) per row: APM on the left, quality on the right.  vLLM metrics
# carry no arm label; the chart's Service/PodMonitors copy the pod label `vllm-lookahead/arm` onto
# every series as `vllm_lookahead_arm`, which separates candidate from baseline.
ROWS: list[
    tuple[tuple[str, str, list[tuple[str, str]]], tuple[str, str, list[tuple[str, str]]]]
] = [
    (
        (
            "End-to-end latency p50 / p95",
            "s",
            [
                (
                    "p50 {{vllm_lookahead_arm}}",
                    f"histogram_quantile(0.5, sum by (le, vllm_lookahead_arm) (rate(vllm:e2e_request_latency_seconds_bucket{{{SEL}}}[$__rate_interval])))",
                ),
                (
                    "p95 {{vllm_lookahead_arm}}",
                    f"histogram_quantile(0.95, sum by (le, vllm_lookahead_arm) (rate(vllm:e2e_request_latency_seconds_bucket{{{SEL}}}[$__rate_interval])))",
                ),
            ],
        ),
        (
            "Drift alarms (0/1) by detector and arm",
            "short",
            [
                (
                    "{{detector}} {{arm}}",
                    f"max by (detector, arm) (quality_sidecar_alarm{{{SEL}}})",
                ),
            ],
        ),
    ),
    (
        (
            "Time to first token / inter-token latency p95",
            "s",
            [
                (
                    "TTFT p95 {{vllm_lookahead_arm}}",
                    f"histogram_quantile(0.95, sum by (le, vllm_lookahead_arm) (rate(vllm:time_to_first_token_seconds_bucket{{{SEL}}}[$__rate_interval])))",
                ),
                (
                    "ITL p95 {{vllm_lookahead_arm}}",
                    f"histogram_quantile(0.95, sum by (le, vllm_lookahead_arm) (rate(vllm:inter_token_latency_seconds_bucket{{{SEL}}}[$__rate_interval])))",
                ),
            ],
        ),
        (
            "Detector p-values",
            "short",
            [
                (
                    "{{detector}} {{arm}}",
                    f"min by (detector, arm) (quality_sidecar_detector_pvalue{{{SEL}}})",
                ),
            ],
        ),
    ),
    (
        (
            "Tokens per second",
            "tokens/s",
            [
                (
                    "generated {{vllm_lookahead_arm}}",
                    f"sum by (vllm_lookahead_arm) (rate(vllm:generation_tokens_total{{{SEL}}}[$__rate_interval]))",
                ),
                ("prompt", f"sum(rate(vllm:prompt_tokens_total{{{SEL}}}[$__rate_interval]))"),
            ],
        ),
        (
            "Refusal rate by arm",
            "percentunit",
            [
                (
                    "{{arm}}",
                    f'avg by (arm) (quality_sidecar_behaviour_rate{{classifier="refusal",{SEL}}})',
                ),
            ],
        ),
    ),
    (
        (
            "Requests running / waiting",
            "short",
            [
                ("running", f"sum(vllm:num_requests_running{{{SEL}}})"),
                ("waiting", f"sum(vllm:num_requests_waiting{{{SEL}}})"),
            ],
        ),
        (
            "Format validity by arm",
            "percentunit",
            [
                (
                    "{{arm}}",
                    f'1 - avg by (arm) (quality_sidecar_behaviour_rate{{classifier="format_invalid",{SEL}}})',
                ),
            ],
        ),
    ),
    (
        (
            "Spec-decode acceptance rate (vLLM)",
            "percentunit",
            [
                (
                    "accepted / drafted",
                    f"sum(rate(vllm:spec_decode_num_accepted_tokens_total{{{SEL}}}[$__rate_interval])) / sum(rate(vllm:spec_decode_num_draft_tokens_total{{{SEL}}}[$__rate_interval]))",
                ),
                (
                    "mean acceptance length",
                    f"1 + sum(rate(vllm:spec_decode_num_accepted_tokens_total{{{SEL}}}[$__rate_interval])) / sum(rate(vllm:spec_decode_num_drafts_total{{{SEL}}}[$__rate_interval]))",
                ),
            ],
        ),
        (
            "Exact match vs baseline (T=0)",
            "percentunit",
            [
                ("{{model}}", f"min by (model) (quality_sidecar_exact_match_rate{{{SEL}}})"),
            ],
        ),
    ),
    (
        (
            "Telemetry sampler: sent / dropped per second",
            "ops",
            [
                ("sent", f"sum(rate(vllm_lookahead_sampler_sent_total{{{SEL}}}[$__rate_interval]))"),
                (
                    "dropped {{reason}}",
                    f"sum by (reason) (rate(vllm_lookahead_sampler_dropped_total{{{SEL}}}[$__rate_interval]))",
                ),
                ("failed", f"sum(rate(vllm_lookahead_sampler_failed_total{{{SEL}}}[$__rate_interval]))"),
            ],
        ),
        (
            "Acceptance rate seen by the sidecar / consumer lag",
            "short",
            [
                ("acceptance {{arm}}", f"avg by (arm) (quality_sidecar_acceptance_rate{{{SEL}}})"),
                (
                    "lag {{group}} {{topic}}",
                    f"sum by (group, topic) (kafka_consumergroup_group_lag{{{SEL}}})",
                ),
                (
                    "lag seconds {{group}} {{topic}}",
                    f"max by (group, topic) (kafka_consumergroup_group_lag_seconds{{{SEL}}})",
                ),
            ],
        ),
    ),
]


def _panel(
    pid: int, x: int, y: int, title: str, unit: str, targets: list[tuple[str, str]]
) -> dict[str, Any]:
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (legend, expr) in enumerate(targets)
        ],
    }


def build() -> dict[str, Any]:
    """The dashboard model: two header rows, then one APM and one quality panel per grid row."""
    panels: list[dict[str, Any]] = [
        {
            "id": 1,
            "type": "text",
            "title": "APM (vLLM)",
            "gridPos": {"h": 2, "w": 12, "x": 0, "y": 0},
            "options": {
                "mode": "markdown",
                "content": "Latency and throughput from vLLM's `/metrics`.",
            },
        },
        {
            "id": 2,
            "type": "text",
            "title": "Quality (sidecar)",
            "gridPos": {"h": 2, "w": 12, "x": 12, "y": 0},
            "options": {
                "mode": "markdown",
                "content": "Drift and behaviour from the quality sidecar.",
            },
        },
    ]
    pid, y = 3, 2
    for left, right in ROWS:
        panels.append(_panel(pid, 0, y, *left))
        panels.append(_panel(pid + 1, 12, y, *right))
        pid, y = pid + 2, y + 8
    return {
        "uid": "vllm-lookahead",
        "title": "vLLM lookahead: APM and quality",
        "tags": ["vllm", "lookahead", "quality"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Data source",
                },
                {
                    "name": "namespace",
                    "type": "query",
                    "label": "Namespace",
                    "includeAll": True,
                    "multi": True,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": {
                        "query": NAMESPACE_QUERY,
                        "refId": "ns",
                    },
                    "refresh": 2,
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output file (default {OUT})")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render())
    print(f"wrote {args.out} ({len(build()['panels'])} panels)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
