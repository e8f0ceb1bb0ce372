"""Write the gate report: ``report.json`` (everything), ``summary.md`` (fits a pull-request comment)
and ``report.html`` (self-contained; matplotlib plots embedded as base64 PNG)."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _status(c: dict[str, Any]) -> str:
    if c["passed"] is None:
        return "skipped" if not c["required"] else "not measured"
    return "pass" if c["passed"] else "FAIL"


def criteria_table(result: dict[str, Any]) -> str:
    rows = ["| criterion | measured | threshold | result | required |", "|---|---|---|---|---|"]
    for c in result["criteria"]:
        rows.append(f"| {c['name']} | {_fmt(c['measured'])} | {c['threshold']} | {_status(c)} | "
                    f"{'yes' if c['required'] else 'no (info)'} |")
    return "\n".join(rows)


def _sampled_table(result: dict[str, Any]) -> list[str]:
    """T>0 samples scored under the baseline model: what the ``sampled`` criterion rests on."""
    sm = result.get("sampled") or {}
    conf = sm.get("conformance") or {}
    if not conf.get("scored"):
        return []
    lp, mp, oos, sc = conf["mean_token_logprob"], conf["mean_pit"], conf["out_of_support"], conf["scoring_s"]
    sh = conf["shift"]
    why = conf.get("out_of_support_reasons") or {}

    def reasons(arm: str) -> str:
        r = why.get(arm) or {}
        return f" ({', '.join(f'{k} {v}' for k, v in sorted(r.items()))})" if r else ""

    rows = ["", f"| T>0 samples ({' / '.join(sm['profiles'])}) under the baseline model | baseline | candidate |",
            "|---|---|---|",
            f"| samples / tokens | {sm['n_baseline']} / {conf['tokens']['baseline']} | "
            f"{sm['n_candidate']} / {conf['tokens']['candidate']} |",
            f"| mean token log-prob (nats) | {_fmt(lp['baseline'])} | {_fmt(lp['candidate'])} |",
            f"| mean PIT u (0.5 if exact) | {_fmt(mp['baseline'])} | {_fmt(mp['candidate'])} |",
            f"| PIT Anderson-Darling p (baseline = A/A control) | {_fmt(conf['pit_baseline_control']['p_value'])} | "
            f"{_fmt(conf['pit_candidate']['p_value'])} |",
            f"| excess log-prob, nats/token (0 if exact) | {_fmt(conf['excess_baseline_control']['nats_per_token'])} | "
            f"{_fmt(conf['excess_candidate']['nats_per_token'])} |",
            f"| excess test p (baseline = A/A control) | {_fmt(conf['excess_baseline_control']['p_value'])} | "
            f"{_fmt(conf['excess_candidate']['p_value'])} |",
            f"| impossible (out-of-support) tokens | {oos['baseline']}{reasons('baseline')} | "
            f"{oos['candidate']}{reasons('candidate')} |",
            f"| scoring time (s) | {_fmt(sc['baseline'])} | {_fmt(sc['candidate'])} |"]
    late = conf.get("excess_late_draft")
    if late:
        rows.append(f"| excess at draft positions >= 2, nats/token (p; {late['tokens']} tokens) | - | "
                    f"{_fmt(late['nats_per_token'])} ({_fmt(late['p_value'])}) |")
    for pb, pc in zip(*((conf.get("profiles") or {}).get(a, []) for a in ("baseline", "candidate"))):
        rows.append(f"| excess, nats/token (p) at {pb['profile']} | {_fmt(pb['excess_nats_per_token'])} "
                    f"({_fmt(pb['excess_p'])}) | {_fmt(pc['excess_nats_per_token'])} ({_fmt(pc['excess_p'])}) |")
    return rows + ["", f"Likelihood shift candidate - baseline: {sh['effect']:+.4f} nats/token, 95% CI "
                   f"[{sh['ci_low']:+.4f}, {sh['ci_high']:+.4f}], p={sh['p_value']:.3g} "
                   f"({'paired over ' + str(sh['n_pairs']) + ' prompts' if sh['paired'] else 'unpaired'})."]


def seeded_table(result: dict[str, Any]) -> list[str]:
    """Seeded T>0 samples token for token: what the ``seeded_exact`` criterion rests on."""
    sx = result.get("seeded_exact")
    if not sx or not sx["candidate"]["n"]:
        return []
    cand, aa, steps = sx["candidate"], sx["aa"], sx["verifier_steps"]
    shown = ", ".join(cand["diverged"][:5]) + (", ..." if len(cand["diverged"]) > 5 else "")
    return ["", "| seeded T>0 samples (token ids) | pairs | differ |", "|---|---|---|",
            f"| candidate vs baseline | {cand['n']} | {cand['mismatches']}{' (' + shown + ')' if shown else ''} |",
            f"| A/A: baseline {sx['aa_mode']} vs all at once | {aa['n'] if aa else 'not run'} | "
            f"{aa['mismatches'] if aa else 'n/a'} |",
            "", "Candidate's T>0 drafted steps by verifier: " +
            (f"coupled {steps.get('coupled', 0)}, vLLM's rejection sampler {steps.get('rejection_sampler', 0)}"
             if steps is not None else "not measurable (endpoint)") +
            f"; excess mismatch {_fmt(sx['excess_mismatch'])}, one-sided Fisher p={_fmt(sx['p_value'])}."]


def crash_lines(crash: dict[str, Any]) -> list[str]:
    """Where the candidate died: run, sampling profile, the requests in flight, the error."""
    reqs = crash["requests"]
    ids = ", ".join(f"`{r['item_id']}` (item {r['item_index']}, sample {r['sample']})" for r in reqs[:10])
    return ["**The candidate crashed** on requests the baseline served; nothing else was measured.", "",
            f"- run: {crash['run']}", f"- sampling profile: {crash['profile_label']}",
            f"- requests in flight ({len(reqs)}): {ids}{', ...' if len(reqs) > 10 else ''}",
            f"- error: `{crash['error']}`"]


def markdown_summary(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [f"### Release gate: **{result['verdict']}**",
             f"`{meta['baseline']['spec']}` (baseline) vs `{meta['candidate']['spec']}` (candidate) on "
             f"{result['n_items']} items ({meta['eval_set_name']}), model `{meta['model_name']}`, {meta['dtype']}",
             "", criteria_table(result), ""]
    if result.get("crash"):
        return "\n".join(lines + crash_lines(result["crash"])) + "\n"
    lat = result["latency"]
    lines += ["<details><summary>details</summary>", ""]
    lines += [f"- {c['name']}: {c['detail']}" for c in result["criteria"] if c["detail"]]
    lines += ["", "| task | n | baseline | candidate | delta | McNemar p (adj.) |", "|---|---|---|---|---|---|"]
    for r in result["pass_rate"]["per_task"]:
        lines.append(f"| {r['task']} | {r['n']} | {r['base_rate']:.3f} | {r['cand_rate']:.3f} | {r['delta']:+.3f} "
                     f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['p_adjusted']:.3g} |")
    lines += _sampled_table(result)
    lines += seeded_table(result)
    b, c = lat["baseline"], lat["candidate"]
    lines += ["", "| latency | baseline | candidate |", "|---|---|---|",
              f"| tokens/s, batch 1 | {_fmt(b.get('seq_tokens_per_s'))} | {_fmt(c.get('seq_tokens_per_s'))} |",
              f"| tokens/s, whole set batched | {_fmt(b['batch_tokens_per_s'])} | {_fmt(c['batch_tokens_per_s'])} |",
              f"| TTFT p50 / p95 (s) | {_fmt(b['ttft_s']['p50'])} / {_fmt(b['ttft_s']['p95'])} | "
              f"{_fmt(c['ttft_s']['p50'])} / {_fmt(c['ttft_s']['p95'])} |",
              f"| TPOT p50 / p95 (s) | {_fmt(b['tpot_s']['p50'])} / {_fmt(b['tpot_s']['p95'])} | "
              f"{_fmt(c['tpot_s']['p50'])} / {_fmt(c['tpot_s']['p95'])} |",
              f"| acceptance rate | {_fmt(b['acceptance_rate'])} | {_fmt(c['acceptance_rate'])} |",
              f"| compression (tokens/step) | {_fmt(b['compression'])} | {_fmt(c['compression'])} |",
              "", f"Minimum detectable pass-rate delta (80% power, alpha {meta['alpha']}): "
              f"{_fmt(result['mde']['pass_rate_delta_at_80pct_power'])} at observed discordance "
              f"{result['mde']['observed_discordance']:.3f}. Gate wall time {meta['wall_s']:.0f} s.",
              *([_sequential_line(result["sequential"])] if result.get("sequential") else []),
              "", "</details>"]
    return "\n".join(lines) + "\n"


def _sequential_line(sq: dict[str, Any]) -> str:
    h = sq["history"][-1]
    how = (f"stopped early at look {sq['stopped_at']} of {sq['looks']} ({h['items']} items): FAIL decided by "
           f"{', '.join(h['decided_fail'])} at alpha {h['alpha']:.3g}" if sq["stopped_early"] else
           f"all {sq['looks']} looks run; the verdict is judged at the last look's alpha {h['alpha']:.3g}")
    return f"Sequential ({sq['spending']}): {how}."


def _png(fig: Any) -> str:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plots(result: dict[str, Any]) -> dict[str, str]:
    """Base64 PNGs: per-task deltas with CIs, first divergence, latency, acceptance per position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}
    rows = result["pass_rate"]["per_task"] + [{"task": "overall", **result["pass_rate"]["overall"]}]
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(rows) + 1))
    ys = list(range(len(rows)))
    d = [r["delta"] for r in rows]
    ax.errorbar(d, ys, xerr=[[r["delta"] - r["ci_low"] for r in rows], [r["ci_high"] - r["delta"] for r in rows]],
                fmt="o", capsize=3)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(ys, [r["task"] for r in rows])
    ax.set_xlabel("pass-rate delta, candidate - baseline (95% paired bootstrap CI)")
    out["Pass-rate delta per task"] = _png(fig)

    em = result["exact_match"]
    fig, ax = plt.subplots(figsize=(6, 3))
    cand = em["candidate"]["first_divergence"]
    aa = (em["aa"] or {}).get("first_divergence", [])
    bins = range(0, max(cand + aa + [1]) + 2)
    ax.hist([cand, aa], bins=list(bins), label=[f"candidate vs baseline ({len(cand)} differ)",
                                                f"A/A baseline vs itself ({len(aa)} differ)"])
    ax.set_xlabel("first divergent output token (index)")
    ax.set_ylabel("requests")
    ax.legend(fontsize=8)
    out["First divergence (T=0)"] = _png(fig)

    lat = result["latency"]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for ax, key, label in ((axes[0], "ttft_samples_s", "TTFT (ms)"), (axes[1], "tpot_samples_s", "time per output token (ms)")):
        data = [[x * 1000 for x in lat[a][key]] or [0.0] for a in ("baseline", "candidate")]
        ax.boxplot(data)
        ax.set_xticks([1, 2], ["baseline", "candidate"])
        ax.set_ylabel(label)
    out[f"Latency ({lat['candidate']['latency_view']})"] = _png(fig)

    pp = lat["candidate"]["acceptance_per_position"]
    fig, ax = plt.subplots(figsize=(5, 3))
    if pp:
        ax.bar([p["position"] for p in pp], [p["rate"] or 0 for p in pp])
        ax.set_ylim(0, 1)
    else:
        ax.text(0.5, 0.5, "candidate drafts no tokens", ha="center", transform=ax.transAxes)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (candidate)")
    out["Acceptance per draft position"] = _png(fig)
    return out


def html_report(result: dict[str, Any], md: str) -> str:
    imgs = plots(result) if not result.get("crash") else {}  # a crash leaves nothing to plot
    colour = "#1a7f37" if result["verdict"] == "PASS" else "#cf222e"
    rows = "".join(
        f"<tr><td>{html.escape(c['name'])}</td><td>{html.escape(_fmt(c['measured']))}</td>"
        f"<td>{html.escape(c['threshold'])}</td><td><b>{_status(c)}</b></td>"
        f"<td>{'yes' if c['required'] else 'no (info)'}</td><td>{html.escape(c['detail'])}</td></tr>"
        for c in result["criteria"])
    figs = "".join(f"<h3>{html.escape(t)}</h3><img src='data:image/png;base64,{b}'/>" for t, b in imgs.items())
    diverged = "".join(
        f"<tr><td>{html.escape(i['id'])}</td><td>{i['baseline_passed']}</td><td>{i['candidate_passed']}</td>"
        f"<td>{i['first_divergence']}</td><td>{html.escape(i['candidate_detail'])}</td></tr>"
        for i in result.get("items", []) if i["first_divergence"] is not None or i["baseline_passed"] != i["candidate_passed"])
    meta = html.escape(json.dumps(result["meta"], indent=1))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Release gate: {result['verdict']}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}td,th{{border:1px solid #ccc;padding:4px;font-size:13px}}
table{{border-collapse:collapse}}</style></head><body>
<h1>Release gate: <span style="color:{colour}">{result['verdict']}</span></h1>
<p>{html.escape(result['meta']['baseline']['spec'])} (baseline) vs {html.escape(result['meta']['candidate']['spec'])}
(candidate), {result['n_items']} items.</p>
<table><tr><th>criterion</th><th>measured</th><th>threshold</th><th>result</th><th>required</th><th>detail</th></tr>{rows}</table>
{figs}
<h3>Items that differ</h3><table><tr><th>item</th><th>baseline pass</th><th>candidate pass</th>
<th>first divergence</th><th>candidate check</th></tr>{diverged}</table>
<h3>Summary (markdown)</h3><pre>{html.escape(md)}</pre>
<h3>Run metadata</h3><pre>{meta}</pre></body></html>"""


def write_report(result: dict[str, Any], runs: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write the report files (and the raw runs) into ``out_dir``; returns their paths.

    Everything is rendered first and each file is moved into place whole (``os.replace``), so a
    failure while rendering leaves no half-written report for a pipeline to pick up."""
    import os
    import tempfile

    md = markdown_summary(result)
    content = {"json": json.dumps(result, indent=1, default=str), "markdown": md,
               "html": html_report(result, md), "runs": json.dumps(runs, default=str),
               "junit": junit_xml(result)}
    names = {"json": "report.json", "markdown": "summary.md", "html": "report.html", "runs": "runs.json",
             "junit": "junit.xml"}
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {k: out_dir / n for k, n in names.items()}
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".partial-") as tmp:
        for k, text in content.items():
            (Path(tmp) / names[k]).write_text(text)
        for k in content:
            os.replace(Path(tmp) / names[k], paths[k])
    return paths


def junit_xml(result: dict[str, Any]) -> str:
    """JUnit XML: one test case per criterion (a failed required criterion is a failure, an
    informational one that did not pass is skipped), so CI systems show the gate like a test run."""
    from xml.etree import ElementTree as ET

    crits = result["criteria"]
    failures = [c for c in crits if c["required"] and c["passed"] is not True]
    skipped = [c for c in crits if not c["required"] and c["passed"] is not True]
    suite = ET.Element("testsuite", name="vllm-lookahead gate", tests=str(len(crits)), failures=str(len(failures)),
                       errors="0", skipped=str(len(skipped)), time=f"{result.get('meta', {}).get('wall_s') or 0:.1f}")
    for c in crits:
        case = ET.SubElement(suite, "testcase", classname="gate", name=c["name"])
        msg = f"measured {_fmt(c['measured'])}; threshold: {c['threshold']}"
        if c in failures:
            ET.SubElement(case, "failure", message=msg).text = c["detail"]
        elif c in skipped:
            ET.SubElement(case, "skipped", message=f"informational: {msg}")
        else:
            ET.SubElement(case, "system-out").text = f"{msg}; {c['detail']}"
    root = ET.Element("testsuites", name="vllm-lookahead gate", tests=str(len(crits)),
                      failures=str(len(failures)))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
