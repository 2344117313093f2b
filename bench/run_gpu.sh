#!/usr/bin/env bash
# Staged GPU work, one device call per stage (each < 10 minutes), results written under $OUT:
#   bash bench/run_gpu.sh build test          # build the extension, run the `gpu` kernel tests
#   bash bench/run_gpu.sh bench-rejection     # bench/bench_rejection.py -> $OUT/rejection_*.{json,md}
#   bash bench/run_gpu.sh bench-sampling      # bench/bench_sampling.py -> $OUT/sampling_*.{json,md}
#   bash bench/run_gpu.sh zoo-train xxs xs    # train zoo sizes on CUDA from the carried token file
#
# zoo-train needs the corpus tokens built on the CPU machine, carried as an ignored path:
#   cp ~/.cache/hsd_fast/zoo/tokens-*.npz .zoo_tokens.npz   (then run with carry=[".zoo_tokens.npz"])
# the hash is checked against zoo/manifest.json before training.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
stage=${1:?stage: build | test | bench-rejection | bench-sampling | zoo-train SIZES...}
shift
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/run_gpu.log"; }

for s in "$stage" "$@"; do
  case "$s" in
    build)
      log "build"
      python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -3
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/run_gpu.log"
      python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" \
        | tee -a "$OUT/run_gpu.log" ;;
    test)
      log "gpu tests"
      python3 -m pytest -q -m gpu tests/ 2>&1 | tee "$OUT/gpu_tests.txt" | tail -5 ;;
    bench-rejection | bench-sampling)
      op=${s#bench-}
      log "$op bench"
      python3 "bench/bench_$op.py" 2>&1 | tee "$OUT/bench_$op.txt" | tail -20
      cp "bench/results/${op}_cuda.json" "bench/results/${op}_cuda.md" "$OUT"/ ;;
    zoo-train)
      log "zoo training: $*"
      mkdir -p "$OUT/zoo"
      cp -r zoo/manifest.json zoo/tokenizer zoo/calibration.safetensors zoo/__init__.py "$OUT/zoo/"
      python3 -m hsd_fast.cli zoo --zoo-dir "$OUT/zoo" build --device cuda --tokens .zoo_tokens.npz --sizes "$@" \
        2>&1 | tail -20
      break ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
done
