#!/usr/bin/env bash
# allocdoc on a real GPU, in one short run (designed for < 8 minutes on an H200 machine):
#   1. cargo build --release (and the examples used below)
#   2. the GPU tests (they skip with a reason when no driver is present)
#   3. calibrated probes validated on the CUDA device under 3 configs
#   4. cache-hit malloc+free latency of the bundled allocator vs raw cuMemAlloc+cuMemFree
#   5. the torch cross-check: 3 traces x 3 configs, when torch is importable
#   6. allocdoc.capture: its recording cost, then a captured OOM replayed with --fidelity
#      (written without a GPU: not yet run on one)
#   7. where the driver places segments: which simulated placement policy matches
#   8. fit: a small Transformer recorded at batch 2 and 4 on a card capped with
#      set_per_process_memory_fraction, predicted against measured at larger batches and at the
#      predicted largest (and one above), defaults and expandable_segments:True
#      (bench/gpu/fit_check.py; written without a GPU: not yet run on one)
#   9. forecast: the same model trained for 300 steps of variable lengths on a capped card,
#      recorded at lengths 128 and 256 first: reserved after each step and the OOM step,
#      predicted against measured, defaults and expandable_segments:True
#      (bench/gpu/forecast_check.py; written without a GPU: not yet run on one)
# Everything lands under $OUT (default bench/gpu/out). Run from the repository root:
#   OUT=/tmp/gpu bash bench/gpu/run.sh
set -u -o pipefail
OUT=${OUT:-bench/gpu/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
step() { echo; echo "=== $(date -u +%H:%M:%S) $*"; }
BIN=target/release/allocdoc

step "machine"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$OUT/gpu.csv" || true
nproc; rustc --version

step "build"
timeout 240 cargo build --release --bins --examples || { echo "build failed"; exit 1; }

step "GPU tests (cuda feature; no skips expected here)"
timeout 120 cargo test --release --lib device::cuda -- --nocapture 2>&1 | tee "$OUT/test-lib-cuda.txt"
timeout 120 cargo test --release --test it -- --include-ignored validate::gpu_ --nocapture 2>&1 | tee "$OUT/test-validate-gpu.txt"

step "traces for the probes and the cross-check"
mkdir -p "$OUT/traces"
timeout 60 target/release/examples/results --write-traces "$OUT/traces" > "$OUT/results-sim.md"
ls -l "$OUT/traces"

step "validate on the CUDA device: text evidence (calibrated probe) and traces, 3 configs each"
CONFS=("expandable_segments:True" "max_split_size_mb:128" "max_split_size_mb:512")
mkdir -p "$OUT/validate"
for ev in fixtures/validate/*.txt "$OUT"/traces/*.csv; do
  [ -e "$ev" ] || continue
  name=$(basename "$ev"); name=${name%.*}
  cap=$(sed -n 's/^# capacity: //p' "$ev" | head -1)
  for c in "${CONFS[@]}"; do
    tag=$(echo "$c" | tr ':,' '__')
    timeout 60 $BIN validate "$ev" --conf "$c" ${cap:+--capacity $cap} --device cuda --format json \
      > "$OUT/validate/$name.$tag.cuda.json" 2> "$OUT/validate/$name.$tag.cuda.err"
    echo "$name $c cuda exit $?"
    timeout 60 $BIN validate "$ev" --conf "$c" ${cap:+--capacity $cap} --device sim --format json \
      > "$OUT/validate/$name.$tag.sim.json" 2>/dev/null
    echo "$name $c sim  exit $?"
  done
done

step "cache-hit latency: bundled allocator on the CUDA device vs raw cuMemAlloc+cuMemFree"
timeout 120 target/release/examples/gpu_latency --out "$OUT/latency.json" || echo "latency failed: $?"

step "torch cross-check (3 traces x 3 configs)"
if timeout 60 python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  mkdir -p "$OUT/torch"
  for t in "$OUT"/traces/*.csv; do
    name=$(basename "$t" .csv)
    cap=$(sed -n 's/^# capacity: //p' "$t" | head -1)
    for c in "" "expandable_segments:True" "max_split_size_mb:128"; do
      tag=$(echo "${c:-default}" | tr ':,' '__')
      timeout 90 python3 scripts/torch_crosscheck.py "$t" --conf "$c" ${cap:+--capacity $cap} \
        --out "$OUT/torch/$name.$tag.torch.json"
      timeout 60 $BIN replay "$t" --conf "$c" ${cap:+--capacity $cap} \
        --compare-with "$OUT/torch/$name.$tag.torch.json" > "$OUT/torch/$name.$tag.compare.txt" 2>&1
      echo "$name ${c:-default}: compare exit $?"
    done
  done
else
  echo "torch with CUDA is not importable here: cross-check skipped" | tee "$OUT/torch-skipped.txt"
fi

step "segment placement: the driver's cuMemAlloc / cuMemAddressReserve / cuMemMap addresses vs the simulated policies"
timeout 120 target/release/examples/gpu_placement --out "$OUT/placement.json" | tee "$OUT/placement.txt" || echo "placement failed: $?"
step "allocdoc.capture: recording cost, then an OOM captured and replayed (NOT YET RUN on a GPU)"
if timeout 60 python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  mkdir -p "$OUT/capture"
  PYTHONPATH=python timeout 240 python3 bench/gpu/capture_oom.py "$OUT/capture" 2>&1 | tee "$OUT/capture/run.txt"
  inc=$(cat "$OUT/capture/capture-incident.txt" 2>/dev/null)
  if [ -n "$inc" ] && [ -e "$inc/snapshot.pickle" ]; then
    ls -l "$inc" | tee "$OUT/capture/incident-files.txt"
    timeout 120 $BIN replay "$inc/snapshot.pickle" --fidelity --format json > "$OUT/capture/replay-fidelity.json"
    echo "replay --fidelity exit $? (1 = the recorded OOM was reproduced)"
    python3 -c 'import json, sys
f = json.load(open(sys.argv[1]))["fidelity"]
ok = f["alloc_events"] == f["address_matches"] and f["first_divergence"] is None
print("capture fidelity:", f["address_matches"], "of", f["alloc_events"], "allocations at the recorded address:", "100 %" if ok else "BELOW 100 %")' \
      "$OUT/capture/replay-fidelity.json" | tee "$OUT/capture/fidelity.txt"
    timeout 120 $BIN recommend "$inc/snapshot.pickle" --format json > "$OUT/capture/recommend.json"
    echo "recommend exit $?"
    timeout 60 $BIN diagnose "$inc"/oom.txt "$inc"/memory_stats.json "$inc"/snapshot.pickle > "$OUT/capture/diagnose.txt" 2>&1
    echo "diagnose exit $?"
  else
    echo "no incident directory was written" | tee "$OUT/capture/failed.txt"
  fi
else
  echo "torch with CUDA is not importable here: capture check skipped" | tee "$OUT/capture-skipped.txt"
fi

step "fit: predicted against measured (NOT YET RUN on a GPU)"
if timeout 60 python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  mkdir -p "$OUT/fit"
  PYTHONPATH=python timeout 420 python3 bench/gpu/fit_check.py "$OUT/fit" "$BIN" 2>&1 | tee "$OUT/fit/run.txt"
else
  echo "torch with CUDA is not importable here: fit check skipped" | tee "$OUT/fit-skipped.txt"
fi

step "forecast: a run of variable lengths, predicted against measured (NOT YET RUN on a GPU)"
if timeout 60 python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  mkdir -p "$OUT/forecast"
  PYTHONPATH=python timeout 600 python3 bench/gpu/forecast_check.py "$OUT/forecast" "$BIN" 2>&1 | tee "$OUT/forecast/run.txt"
else
  echo "torch with CUDA is not importable here: forecast check skipped" | tee "$OUT/forecast-skipped.txt"
fi

step "done"
