#!/usr/bin/env bash
# Staged GPU work, one device call per stage (each < 10 minutes), results written under $OUT:
#   bash bench/run_gpu.sh build test          # build the extension, run the `gpu` kernel tests
#   bash bench/run_gpu.sh test-attention      # the tree-attention kernel's `gpu` tests alone
#   bash bench/run_gpu.sh bench-rejection     # bench/bench_rejection.py -> $OUT/rejection_*.{json,md}
#   bash bench/run_gpu.sh bench-sampling      # bench/bench_sampling.py -> $OUT/sampling_*.{json,md}
#   bash bench/run_gpu.sh bench-tree-attention  # bench/bench_tree_attention.py --flex -> $OUT/tree_attention_*
#   bash bench/run_gpu.sh bench-splits        # bench/bench_tree_attention.py --splits -> $OUT/tree_attention_splits_*
#   bash bench/run_gpu.sh attention-e2e       # bench/bench_attention_e2e.py -> $OUT/attention_e2e_*
#   bash bench/run_gpu.sh attention-e2e-compiled  # the same with compiled steps, batch 1, context 768
#   bash bench/run_gpu.sh test-graphs         # the CUDA-graph tests alone: replay, no re-record
#   bash bench/run_gpu.sh e2e-twin            # compiled, dense, batch 1 and 16: s as a weight-bound cost
#                                             # twin (hidden 2048, 8 layers, MLP 8192: ~0.5 B parameters,
#                                             # fp32); no draft, xs > s, lookup > xs > s
#   bash bench/run_gpu.sh zoo-train xxs xs    # train zoo sizes on CUDA from the carried token file
#   bash bench/run_gpu.sh build family        # the family at real shapes (bench/bench_family.py: an
#                                             # 8B-shaped bf16 target, a 1B-shaped draft, HF's baselines),
#                                             # rows written as measured; stops starting rows at FAMILY_BUDGET
#                                             # seconds (default 470) and is cut at FAMILY_LIMIT (545);
#                                             # each of our rows also profiled once: the GPU's busy share
#   bash bench/run_gpu.sh build profile-family  # bench/profile_round.py --family: per level, a round's
#                                             # device and host time, the busy share, kernel tables; dense
#                                             # masks and the tree-attention kernel side by side
#
# zoo-train needs the corpus tokens built on the CPU machine, carried as an ignored path:
#   cp ~/.cache/hsd_fast/zoo/tokens-*.npz .zoo_tokens.npz   (then run with carry=[".zoo_tokens.npz"])
# the hash is checked against zoo/manifest.json before training.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
stage=${1:?stage: build | family | profile-family | test | test-graphs | test-attention | bench-rejection | bench-sampling | bench-tree-attention | bench-splits | attention-e2e | attention-e2e-compiled | e2e-twin | zoo-train SIZES...}
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
    test-graphs)
      log "CUDA-graph tests"
      python3 -m pytest -q -m gpu tests/test_compiled.py 2>&1 | tee "$OUT/gpu_tests_graphs.txt" | tail -5 ;;
    test-attention)
      log "tree-attention gpu tests"
      python3 -m pytest -q -m gpu tests/test_tree_attention.py 2>&1 | tee "$OUT/gpu_tests_attention.txt" | tail -5 ;;
    bench-rejection | bench-sampling | bench-tree-attention)
      op=${s#bench-}
      op=${op//-/_}
      log "$op bench"
      flags=()
      [[ $op == tree_attention ]] && flags=(--flex)
      python3 "bench/bench_$op.py" "${flags[@]}" 2>&1 | tee "$OUT/bench_$op.txt" | tail -20
      cp "bench/results/${op}_cuda.json" "bench/results/${op}_cuda.md" "$OUT"/ ;;
    attention-e2e)
      log "fused attention end to end"
      python3 bench/bench_attention_e2e.py --passes 2 2>&1 | tee "$OUT/attention_e2e.txt" | tail -20
      cp bench/results/attention_e2e_cuda.json bench/results/attention_e2e_cuda.md "$OUT"/ ;;
    attention-e2e-compiled)
      log "fused attention end to end, compiled steps"
      python3 bench/bench_attention_e2e.py --compiled --passes 2 --batch 1 --context 768 2>&1 \
        | tee "$OUT/attention_e2e_compiled.txt" | tail -20
      cp bench/results/attention_e2e_compiled_cuda.json bench/results/attention_e2e_compiled_cuda.md "$OUT"/ ;;
    e2e-twin)
      log "end to end, compiled steps, the target as a weight-bound cost twin"
      python3 bench/bench_attention_e2e.py --compiled --passes 3 --batch 1 16 --context 768 \
        --twin 2048 8 8192 --only "no draft, dense" ", xs > s, T=3, dense" "lookup > xs > s, T=[1, 3], dense" \
        2>&1 | tee "$OUT/attention_e2e_twin_compiled.txt" | tail -20
      cp bench/results/attention_e2e_twin_compiled_cuda.json bench/results/attention_e2e_twin_compiled_cuda.md "$OUT"/ ;;
    family)
      log "the family at real shapes, bf16"
      export PYTHONUNBUFFERED=1
      timeout "${FAMILY_LIMIT:-545}" python3 bench/bench_family.py --out "$OUT" --budget "${FAMILY_BUDGET:-470}" \
        2>&1 | tee "$OUT/family.log" | tr '\r' '\n' | grep -v "compiling steps" | tail -40 || true
      log "family done" ;;
    profile-family)
      log "round profile of the family at real shapes, bf16, dense and fused attention"
      export PYTHONUNBUFFERED=1
      timeout "${PROFILE_LIMIT:-545}" python3 bench/profile_round.py --family --attention dense fused \
        --budget "${PROFILE_BUDGET:-420}" --out "$OUT/profile_round_family" 2>&1 | tee "$OUT/profile_family.log" \
        | tr '\r' '\n' | grep -v "compiling steps" | tail -30 || true
      log "profile done" ;;
    bench-splits)
      log "tree-attention slot splits"
      python3 bench/bench_tree_attention.py --splits 2>&1 | tee "$OUT/bench_splits.txt" | tail -20
      cp bench/results/tree_attention_splits_cuda.json bench/results/tree_attention_splits_cuda.md "$OUT"/ ;;
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
