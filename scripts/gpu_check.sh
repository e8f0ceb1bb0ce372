#!/usr/bin/env bash
# One prepared GPU check of the plugin (issue 15): exactness, bf16 match, speed, in one go.
#
#   scripts/gpu_check.sh                 # on a CUDA machine: the full check (budget: 8 min on one GPU)
#   scripts/gpu_check.sh --smoke         # on CPU: the same steps at toy size, one process per step
#                                        # (CI runs it: tests/test_gpu_check.py)
#   scripts/gpu_check.sh --model DIR --k 4 --out benchmarks/results
#
# Steps (each one existing CLI; `vllm-lookahead bench` runs every method in a fresh process):
#   1. float32 exactness: none vs the chain (lookahead:k=K) vs the 2D layout (lookahead2d, forced on
#      at every batch size, FlexAttention on CUDA) at batch 1/8/32 -> gpu_check_fp32.json
#   2. seeded T>0 (float32, T=0.8, a seed per request): none vs lookahead:k=K at batch 1/8/32 ->
#      gpu_check_seeded_fp32.json; coupled verification must give none's tokens (on CUDA by vLLM's
#      native sampling rule, which CUDA uses for seeded batches: docs/lookahead.md)
#   3. bfloat16 bench: none / ngram / suffix / lookahead at batch 1/8/32, 3 interleaved repeats
#      (median [min, max] tokens/s) -> gpu_check_bench_bf16.json; also gives the bf16 match rate of
#      each method next to none's A/A rate (none at batch b vs none at batch 1)
#   4. verdict: scripts/gpu_check.py -> gpu_check_summary.json; exit 1 on a failed check (fp32 not
#      identical, 2D step never taken, seeded T>0 not identical, bf16 mismatch beyond the A/A yardstick)
#
# Status: written without a GPU (none was lent to the session that wrote it); only --smoke has run.
# Budget estimate for the full mode on one GPU with the demo model: 15 spawned bench processes and
# 45 engine starts (~5 s each on a GPU, eager mode) plus generation: ~5-7 min.  Each step has a hard
# time limit so the script ends inside 8 minutes even when the estimate is wrong.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

ARGS="$*"
SMOKE=0
MODEL=""
K=4            # default k of this check (README's table and example use k=8: pass --k 8 to match)
OUT="benchmarks/results"
PY="${PYTHON:-.venv/bin/python}"
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --model) MODEL="$2"; shift ;;
    --k) K="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ "$K" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check.sh: --k must be a positive integer, got '$K'" >&2; exit 2; }
[[ -x "$PY" ]] || { echo "gpu_check.sh: $PY not found; run scripts/setup.sh (or set PYTHON)" >&2; exit 2; }
MODEL_ARGS=()
[[ -n "$MODEL" ]] && MODEL_ARGS=(--model "$MODEL")

if [[ $SMOKE == 1 ]]; then
  # CPU, toy size: checks that every step, argument and the verdict still work (not a measurement).
  # All methods in one process per step (--isolation none): vLLM is imported twice, not seven times.
  N=2; TOKENS=8; BATCHES="1"; REPEATS=1; LIMIT=600
  ISO=(--isolation none)
  ATTN=()                    # the CPU backend runs the 2D layout itself
  PREFIX="gpu_check_smoke"
  export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" TOKENIZERS_PARALLELISM=false
else
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check.sh: no CUDA device visible to torch; use --smoke for the CPU mode" >&2
    exit 2
  fi
  N=64; TOKENS=128; BATCHES="1,8,32"; REPEATS=3; LIMIT=180  # step 1: 3 min, step 2: 4.5 min
  ISO=()                     # every method in a fresh process (the bench default)
  ATTN=(--attention-backend FLEX_ATTENTION)  # the 2D layout's CUDA path (lade2d/flex_mask.py)
  PREFIX="gpu_check"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
MAX_BATCH="${BATCHES##*,}"
mkdir -p "$OUT"
FP32="$OUT/${PREFIX}_fp32.json"
SEEDED="$OUT/${PREFIX}_seeded_fp32.json"
BENCH="$OUT/${PREFIX}_bench_bf16.json"
SUMMARY="$OUT/${PREFIX}_summary.json"
BENCH_CMD=("$PY" -m vllm_lookahead.cli bench "${MODEL_ARGS[@]}" --prompts open --n "$N"
           --max-tokens "$TOKENS" --batch-sizes "$BATCHES" "${ISO[@]}")
start=$SECONDS
# run STEP_NAME LIMIT_S CMD...: a step that overruns its limit ends the script with a clear message
run() {
  local name="$1" limit="$2" rc=0; shift 2
  timeout "$limit" "$@" || rc=$?
  if [[ $rc == 124 ]]; then echo "gpu_check.sh: $name exceeded its ${limit} s limit" >&2; exit 1; fi
  if [[ $rc != 0 ]]; then echo "gpu_check.sh: $name failed (exit $rc)" >&2; exit "$rc"; fi
}

echo "[gpu_check] 1/4 float32 exactness: none, chain, 2D at batch $BATCHES" >&2
run "step 1 (float32 exactness)" "$LIMIT" "${BENCH_CMD[@]}" --dtype float32 "${ATTN[@]}" \
  --methods "none lookahead:k=$K lookahead2d:W=5,N=3,G=5,max_batch=$MAX_BATCH,policy=always" \
  --json "$FP32"

echo "[gpu_check] 2/4 seeded T=0.8, float32: none, lookahead at batch $BATCHES" >&2
run "step 2 (seeded T>0)" "$LIMIT" "${BENCH_CMD[@]}" --dtype float32 --temperature 0.8 --request-seed 1 \
  --methods "none lookahead:k=$K" --json "$SEEDED"

echo "[gpu_check] 3/4 bfloat16 bench: none, ngram, suffix, lookahead x $REPEATS repeats" >&2
run "step 3 (bfloat16 bench)" "$((LIMIT * 3 / 2))" "${BENCH_CMD[@]}" --dtype bfloat16 --repeats "$REPEATS" \
  --methods "none ngram:k=$K,n_min=1,n_max=4 suffix:k=$K lookahead:k=$K" \
  --json "$BENCH"

echo "[gpu_check] 4/4 verdict ($((SECONDS - start)) s so far)" >&2
"$PY" scripts/gpu_check.py --fp32 "$FP32" --seeded "$SEEDED" --bench "$BENCH" --json "$SUMMARY" \
  --mode "$([[ $SMOKE == 1 ]] && echo smoke || echo gpu)" --command "scripts/gpu_check.sh $ARGS"
echo "[gpu_check] done in $((SECONDS - start)) s" >&2
