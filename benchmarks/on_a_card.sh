#!/usr/bin/env bash
# The checks a GPU machine runs, from a checkout, one per call: `bash benchmarks/on_a_card.sh CHECK`.
#
#   tests        the CUDA-marked tests (`pytest -m cuda`)
#   digits       pipelines/digits.toml end to end, no flags      → RESULTS/digits-gpu/end_to_end.json
#   fashion-fc1  pipelines/fashion-fc1.toml end to end, no flags → RESULTS/fashion-fc1-gpu/end_to_end.json
#   chains       bench_chains.py's CUDA rows                     → RESULTS/gpu/bench_chains_cuda.json
#   gans         bench_chain_gans.py on the card                 → RESULTS/gpu/bench_chain_gans_cuda.json
#
# RESULTS is $OUT where it is set (a folder that comes back), else docs/results. On a machine without the
# project's pip packages, .whl/ from `make wheels` is installed into .whl/site first (`make bare-install`),
# and Fashion-MNIST's four .gz files in .whl/fashion-mnist/, if there, are copied where the pipeline reads
# them. A pipeline's artifacts and record stay in artifacts/on-a-card/ (kept while the machine is): with
# BUDGET=SECONDS the check is stopped as Ctrl-C would stop it after that long, its record (the stages it
# finished) copied to RESULTS all the same, and the same command run again goes on with the stage it stopped
# in, timed again from that stage's start (benchmarks/time_pipeline.py --resume); remove artifacts/on-a-card
# to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
checks="tests, digits, fashion-fc1, chains or gans"
check=${1:-}
case "$check" in
    tests | digits | fashion-fc1 | chains | gans) ;;
    *) echo "on_a_card.sh: ${check:+unknown check '$check'; }give one of $checks" >&2; exit 2 ;;
esac
results=${OUT:-docs/results}
if [ -d .whl ] && [ ! -d .whl/site ]; then
    python3 -m pip install -q --no-deps --no-index --target .whl/site .whl/*.whl
fi
export PYTHONPATH=".whl/site:.${PYTHONPATH:+:$PYTHONPATH}"
fashion=/usr/share/datasets/fashion-mnist
if [ -d .whl/fashion-mnist ] && [ ! -e "$fashion/train-images-idx3-ubyte.gz" ]; then
    mkdir -p "$fashion" && cp .whl/fashion-mnist/*.gz "$fashion/"
fi
budget=${BUDGET:-0}
within_budget() {
    if [ "$budget" -gt 0 ]; then timeout --signal=INT "$budget" "$@"; else "$@"; fi
}
if command -v nvidia-smi > /dev/null; then nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader; fi
case "$check" in
    tests) within_budget python3 -m pytest -m cuda -q -rfE ;;  # every failure in one call: card time is scarce
    digits | fashion-fc1)
        record="artifacts/on-a-card/$check.json" status=0
        mkdir -p artifacts/on-a-card "$results/$check-gpu"
        resume=()
        if [ -f "$record" ]; then resume=(--resume); fi
        within_budget python3 benchmarks/time_pipeline.py --config "pipelines/$check.toml" \
            --artifacts "artifacts/on-a-card/$check" --out "$record" "${resume[@]}" || status=$?
        if [ -f "$record" ]; then cp "$record" "$results/$check-gpu/end_to_end.json"; fi
        exit "$status" ;;
    chains)
        within_budget python3 benchmarks/bench_chains.py --cuda-only --reps 3 --steps 100 --out "$results/gpu/bench_chains_cuda.json" ;;
    gans)
        within_budget python3 benchmarks/bench_chain_gans.py --device cuda --chains 4 12 --out "$results/gpu/bench_chain_gans_cuda.json" ;;
esac
