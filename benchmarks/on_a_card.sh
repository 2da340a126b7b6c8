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
# them. A record is written as each stage ends, so a run stopped early keeps what it finished.
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
if command -v nvidia-smi > /dev/null; then nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader; fi
case "$check" in
    tests) python3 -m pytest -m cuda -q -x ;;
    digits | fashion-fc1)
        python3 benchmarks/time_pipeline.py --config "pipelines/$check.toml" --out "$results/$check-gpu/end_to_end.json" ;;
    chains)
        python3 benchmarks/bench_chains.py --cuda-only --reps 3 --steps 100 --out "$results/gpu/bench_chains_cuda.json" ;;
    gans)
        python3 benchmarks/bench_chain_gans.py --device cuda --chains 4 12 --out "$results/gpu/bench_chain_gans_cuda.json" ;;
esac
