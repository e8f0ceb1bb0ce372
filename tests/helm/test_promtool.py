"""The chart's alerts and dashboard queries, checked and unit-tested by the real promtool.

- ``promtool check rules`` on the rendered PrometheusRule (syntax, templates, durations);
- ``promtool test rules`` for every alert: it fires on matching series of the release's pods in its
  namespace (with its labels and expanded annotations), stays quiet on healthy series, and ignores
  the same series from another namespace, from another release's pods in the same namespace and,
  for the Kafka alerts, from another consumer group;
- every dashboard query, with Grafana's variables replaced, parsed by promtool as a recording rule,
  and the APM queries evaluated on vLLM-only series (sidecar off) to show they return data.

promtool comes from Debian's prometheus package (scripts/setup.sh promtool); nothing is mocked.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_chart_support import NAMESPACE, RELEASE, by_kind, ci_file, component

from tests.support.paths import tool

pytestmark = pytest.mark.helm

# Series as the chart's Service/PodMonitors label them: namespace and pod (pods are <fullname>-<component>-...).
NS = f'namespace="{NAMESPACE}", pod="{RELEASE}-vllm-lookahead-server-5f7d9-x2k4q"'
OTHER = f'namespace="other", pod="{RELEASE}-vllm-lookahead-server-5f7d9-x2k4q"'
OTHER_RELEASE = f'namespace="{NAMESPACE}", pod="other-vllm-lookahead-server-5f7d9-x2k4q"'
GROUP = 'group="quality-sidecar"'  # sidecar.group default: the Kafka alerts select this release's group


@pytest.fixture(scope="module")
def promtool() -> Path:
    return tool("promtool")


@pytest.fixture(scope="module")
def rules_file(render, tmp_path_factory) -> Path:
    rule = by_kind(render(ci_file("everything-on")), "PrometheusRule")[0]
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def _alerts(rules_file: Path) -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(rules_file.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def _promtool(promtool: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          check=False)


def test_rendered_rules_pass_promtool_check(promtool: Path, rules_file: Path, render, tmp_path: Path) -> None:
    proc = _promtool(promtool, "check", "rules", str(rules_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
    # The check itself can fail: a broken expression is reported.
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"alert": "A", "expr": "sum(rate(x[5m])"}]}]}))
    assert _promtool(promtool, "check", "rules", str(bad)).returncode != 0


# --- unit tests of every alert ---------------------------------------------------------------------

Series = list[tuple[str, str]]  # (series selector, promtool values notation)


def _case(series: Series, eval_time: str, alert: str, expected: list[dict[str, Any]], interval: str = "1m"
          ) -> dict[str, Any]:
    return {"interval": interval,
            "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [{"eval_time": eval_time, "alertname": alert, "exp_alerts": expected}]}


def _go_value(v: float) -> str:
    """How Go's text/template prints a float64 `$value` (strconv 'g', shortest)."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e21 else repr(v)


def _expand(template: str, labels: dict[str, str], value: float) -> str:
    """Expand the few template forms the chart's annotations use (checked against promtool's own)."""
    out = re.sub(r"\{\{ \$value \| humanizePercentage \}\}", lambda _m: f"{value * 100:.4g}%", template)
    out = out.replace("{{ $value }}", _go_value(value))
    out = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], out)
    assert "{{" not in out, f"unexpanded template in {template!r}"
    return out


def _fires(rule: dict[str, Any], labels: dict[str, str], value: float) -> dict[str, Any]:
    exp_labels = {**rule.get("labels", {}), **labels}
    return {"exp_labels": exp_labels,
            "exp_annotations": {k: _expand(v, exp_labels, value) for k, v in rule["annotations"].items()}}


def _moved(series: Series, where: str) -> Series:
    """The same series from another namespace or another release's pods."""
    return [(s.replace(NS, where), v) for s, v in series]


M = 'model="m"'
LAG = f'cluster_name="c", {GROUP}, topic="t", member_host="h", consumer_id="x", client_id="k"'
LAG_OTHER = LAG.replace(GROUP, 'group="other"')  # another release's consumer group, same namespace
LAG_NEW_MEMBER = LAG.replace('consumer_id="x"', 'consumer_id="y"')  # the partition's owner after a rebalance

# alert -> (firing series, eval time, labels of the alert, $value at eval, quiet series, interval).
CASES: dict[str, tuple[Series, str, dict[str, str], float, list[Series], str]] = {
    "VllmLookaheadDriftAlarm": (
        [(f'quality_sidecar_alarm{{{NS}, detector="refusal", {M}, arm="candidate"}}', "1x20")],
        "10m", {"detector": "refusal", "model": "m", "arm": "candidate"}, 1,
        [[(f'quality_sidecar_alarm{{{NS}, detector="refusal", {M}, arm="candidate"}}', "0x20")],
         # a latched alarm shorter than `for: 5m` does not page
         [(f'quality_sidecar_alarm{{{NS}, detector="refusal", {M}, arm="candidate"}}', "0x5 1x3 0x12")]],
        "1m"),
    "VllmLookaheadExactMatchLow": (
        [(f"quality_sidecar_exact_match_rate{{{NS}, {M}}}", "0.9x30")],
        "20m", {"model": "m"}, 0.9,
        [[(f"quality_sidecar_exact_match_rate{{{NS}, {M}}}", "0.99x30")]], "1m"),
    "VllmLookaheadSamplingConformanceUnmonitored": (
        [(f"quality_sidecar_conformance_monitored{{{NS}}}", "0x90")],
        "70m", {}, 0,
        [[(f"quality_sidecar_conformance_monitored{{{NS}}}", "1x90")]], "1m"),
    "VllmLookaheadBaselineServerDown": (
        [(f'quality_sidecar_baseline_up{{{NS}, worker="conformance"}}', "0x30")],
        "20m", {"worker": "conformance"}, 0,
        [[(f'quality_sidecar_baseline_up{{{NS}, worker="conformance"}}', "1x30")],
         # a short outage that the retries ride out does not page
         [(f'quality_sidecar_baseline_up{{{NS}, worker="conformance"}}', "1x10 0x5 1x15")]], "1m"),
    "VllmLookaheadDLQGrowing": (
        [(f'quality_sidecar_dlq_total{{{NS}, reason="schema"}}', "0+5x40")],
        "30m", {"reason": "schema"}, 0,
        [[(f'quality_sidecar_dlq_total{{{NS}, reason="schema"}}', "5x40")]], "1m"),
    "VllmLookaheadAcceptanceRateLow": (
        [(f'vllm:spec_decode_num_accepted_tokens_total{{{NS}, model_name="m"}}', "0+10x40"),
         (f'vllm:spec_decode_num_draft_tokens_total{{{NS}, model_name="m"}}', "0+100x40")],
        "30m", {"model_name": "m"}, 0.1,
        [[(f'vllm:spec_decode_num_accepted_tokens_total{{{NS}, model_name="m"}}', "0+50x40"),
          (f'vllm:spec_decode_num_draft_tokens_total{{{NS}, model_name="m"}}', "0+100x40")]], "1m"),
    "VllmLookaheadAcceptanceRateDrop": (
        # 5 min steps: a day at 50% acceptance, then 3 h at 10% (< 0.7 x yesterday's 50%)
        [(f'vllm:spec_decode_num_accepted_tokens_total{{{NS}, model_name="m"}}', "0+50x288 14400+10x36"),
         (f'vllm:spec_decode_num_draft_tokens_total{{{NS}, model_name="m"}}', "0+100x324")],
        "1620m", {"model_name": "m"}, 0,
        [[(f'vllm:spec_decode_num_accepted_tokens_total{{{NS}, model_name="m"}}', "0+50x324"),
          (f'vllm:spec_decode_num_draft_tokens_total{{{NS}, model_name="m"}}', "0+100x324")]], "5m"),
    "VllmLookaheadSamplerDropping": (
        [(f'vllm_lookahead_sampler_dropped_total{{{NS}, reason="queue_full"}}', "0+10x40"),
         (f"vllm_lookahead_sampler_sampled_total{{{NS}}}", "0+100x40")],
        "30m", {}, 0.1,
        [[(f'vllm_lookahead_sampler_dropped_total{{{NS}, reason="queue_full"}}', "0+1x40"),
          (f"vllm_lookahead_sampler_sampled_total{{{NS}}}", "0+100x40")]], "1m"),
    "VllmLookaheadSamplerFailing": (
        [(f"vllm_lookahead_sampler_failed_total{{{NS}}}", "0+1x40")],
        "30m", {}, 0,
        [[(f"vllm_lookahead_sampler_failed_total{{{NS}}}", "3x40")]], "1m"),
    "QualitySidecarConsumerLag": (
        [(f'kafka_consumergroup_group_lag{{{NS}, {LAG}, partition="0"}}', "6000x30"),
         (f'kafka_consumergroup_group_lag{{{NS}, {LAG}, partition="1"}}', "6000x30")],
        "20m", {"cluster_name": "c", "group": "quality-sidecar", "topic": "t"}, 12000,
        [[(f'kafka_consumergroup_group_lag{{{NS}, {LAG}, partition="0"}}', "3000x30"),
          (f'kafka_consumergroup_group_lag{{{NS}, {LAG}, partition="1"}}', "3000x30")],
         # another release's consumer group in the same namespace
         [(f'kafka_consumergroup_group_lag{{{NS}, {LAG_OTHER}, partition="0"}}',
           "20000x30")]], "1m"),
    "QualitySidecarConsumerStalled": (
        [(f'kafka_consumergroup_group_offset{{{NS}, {LAG}, partition="3"}}', "500x40"),
         (f'kafka_consumergroup_group_lag{{{NS}, {LAG}, partition="3"}}', "200x40")],
        "25m", {"cluster_name": "c", "group": "quality-sidecar", "topic": "t", "partition": "3"}, 0,
        [  # progressing with lag: not a stall
            [(f'kafka_consumergroup_group_offset{{{NS}, {LAG}, partition="3"}}', "0+10x40"),
             (f'kafka_consumergroup_group_lag{{{NS}, {LAG}, partition="3"}}', "200x40")],
            # idle topic, caught up: not a stall
            [(f'kafka_consumergroup_group_offset{{{NS}, {LAG}, partition="3"}}', "500x40"),
             (f'kafka_consumergroup_group_lag{{{NS}, {LAG}, partition="3"}}', "0x40")],
            # a rebalance in the window: the new member's series starts at a later offset
            [(f'kafka_consumergroup_group_offset{{{NS}, {LAG}, partition="3"}}', "500x15"),
             (f'kafka_consumergroup_group_offset{{{NS}, {LAG_NEW_MEMBER}, partition="3"}}',
              "_x16 520x9"),
             (f'kafka_consumergroup_group_lag{{{NS}, {LAG}, partition="3"}}', "200x25")],
            # another release's group stalls
            [(f'kafka_consumergroup_group_offset{{{NS}, {LAG_OTHER}, partition="3"}}',
              "500x40"),
             (f'kafka_consumergroup_group_lag{{{NS}, {LAG_OTHER}, partition="3"}}',
              "200x40")],
        ], "1m"),
}


def test_every_alert_has_unit_tests(rules_file: Path) -> None:
    assert set(_alerts(rules_file)) == set(CASES), "add a CASES entry (fires / quiet / other namespace)"


@pytest.mark.parametrize("alert", sorted(CASES))
def test_alert_fires_stays_quiet_and_is_namespace_scoped(alert: str, promtool: Path, rules_file: Path,
                                                         tmp_path: Path) -> None:
    firing, at, labels, value, quiet, interval = CASES[alert]
    rule = _alerts(rules_file)[alert]
    tests = [_case(firing, at, alert, [_fires(rule, labels, value)], interval)]
    tests += [_case(q, at, alert, [], interval) for q in quiet]
    tests.append(_case(_moved(firing, OTHER), at, alert, [], interval))  # another namespace: silent
    tests.append(_case(_moved(firing, OTHER_RELEASE), at, alert, [], interval))  # another release: silent
    spec = tmp_path / "tests.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules_file)], "evaluation_interval": interval,
                                    "tests": tests}, sort_keys=False))
    proc = _promtool(promtool, "test", "rules", str(spec))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # ...and promtool really compares: expecting silence where the alert fires fails.
    tests[0]["alert_rule_test"][0]["exp_alerts"] = []
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules_file)], "tests": tests[:1]}, sort_keys=False))
    assert _promtool(promtool, "test", "rules", str(spec)).returncode != 0


# --- dashboard ------------------------------------------------------------------------------------

GRAFANA_VARS: dict[str, str] = {"$__rate_interval": "2m", "$namespace": NAMESPACE}  # 4 x 30 s scrape


def _dashboard(render: Callable[..., Any], *extra: str) -> dict[str, Any]:
    cm = component(render(ci_file("defaults"), *extra), "ConfigMap", "dashboard")
    return json.loads(cm["data"]["vllm-lookahead.json"])


def _substitute(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def _targets(dash: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(p, t) for p in dash["panels"] if p["type"] == "timeseries" for t in p["targets"]]


def test_every_dashboard_query_parses_and_uses_rate_interval(promtool: Path, render, tmp_path: Path) -> None:
    dash = _dashboard(render)
    targets = _targets(dash)
    assert len(targets) >= 20
    for _p, t in targets:
        for window in re.findall(r"\[([^\]]+)\]", t["expr"]):
            assert window == "$__rate_interval", f"fixed range [{window}] in {t['expr']!r}"
    rules = [{"record": f"dashboard:panel{p['id']}_{t['refId']}", "expr": _substitute(t["expr"])}
             for p, t in targets]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = _promtool(promtool, "check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(rules)} rules found" in proc.stdout


def _vllm_only_series() -> Series:
    """What a server-only release exports (sidecar disabled): vLLM's and the sampler's metrics."""
    s = f'{NS}, vllm_lookahead_arm="candidate", model_name="m"'
    out: Series = []
    for hist in ("e2e_request_latency_seconds", "time_to_first_token_seconds", "inter_token_latency_seconds"):
        for le, rate in (("0.1", 1), ("1", 3), ("10", 4), ("+Inf", 4)):
            out.append((f'vllm:{hist}_bucket{{{s}, le="{le}"}}', f"0+{rate}x40"))
    for counter, rate in (("generation_tokens_total", 50), ("prompt_tokens_total", 20),
                          ("spec_decode_num_accepted_tokens_total", 30), ("spec_decode_num_draft_tokens_total", 60),
                          ("spec_decode_num_drafts_total", 15)):
        out.append((f"vllm:{counter}{{{s}}}", f"0+{rate}x40"))
    out += [(f"vllm:num_requests_running{{{s}}}", "3x40"), (f"vllm:num_requests_waiting{{{s}}}", "1x40")]
    out += [(f"vllm_lookahead_sampler_sent_total{{{NS}}}", "0+2x40"),
            (f'vllm_lookahead_sampler_dropped_total{{{NS}, reason="queue_full"}}', "0+1x40"),
            (f"vllm_lookahead_sampler_failed_total{{{NS}}}", "0+1x40")]
    return out


def test_apm_panels_and_namespace_variable_work_with_the_sidecar_disabled(promtool: Path, render,
                                                                           tmp_path: Path) -> None:
    dash = _dashboard(render, "--set", "sidecar.enabled=false")
    apm = [(p, t) for p, t in _targets(dash) if p["gridPos"]["x"] == 0]
    assert len(apm) >= 10
    assert not any("quality_sidecar" in t["expr"] for _p, t in apm)
    ns_var = next(v for v in dash["templating"]["list"] if v["name"] == "namespace")
    m = re.fullmatch(r"label_values\((.+), namespace\)", ns_var["query"]["query"])
    assert m, ns_var["query"]
    # Evaluated by promtool on vLLM-only series: every APM query returns data, and the namespace
    # variable's selector finds the release's namespace.
    exprs = [{"expr": f"count({_substitute(t['expr'])}) > bool 0", "eval_time": "15m",
              "exp_samples": [{"labels": "{}", "value": 1}]} for _p, t in apm]
    exprs.append({"expr": f"count by (namespace) ({m.group(1)})", "eval_time": "15m",
                  "exp_samples": [{"labels": f'{{namespace="{NAMESPACE}"}}', "value": 1}]})
    empty = tmp_path / "empty.yaml"
    empty.write_text(yaml.safe_dump({"groups": []}))
    spec = tmp_path / "apm.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(empty)], "tests": [{
        "interval": "30s", "input_series": [{"series": s, "values": v} for s, v in _vllm_only_series()],
        "promql_expr_test": exprs}]}, sort_keys=False))
    proc = _promtool(promtool, "test", "rules", str(spec))
    assert proc.returncode == 0, proc.stdout + proc.stderr
