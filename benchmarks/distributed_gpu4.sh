#!/usr/bin/env bash
# Issue 54's four-GPU measurement (docs/workers.md), on one host with 4 GPUs, after `benchmarks/gpu_carry.sh device`
# (onnxruntime-gpu, zoo:ppocr-cls and zoo:ppocr-det, PostgreSQL). Each run is a process of its own with its own
# PostgreSQL server and autoprec cache: ppocr-cls's 1-GPU run ALONE first (the baseline), its 4-GPU run and
# ppocr-det's 4-GPU run, each alone; then ppocr-det's 1-GPU run (GPU 0) beside ppocr-det's and then ppocr-cls's 2-GPU
# runs (GPUs 1-2) and a second seed of ppocr-cls's 1-GPU run (GPU 3); last the second seed at four GPUs, alone.
# ppocr-det at batch 8 with --max-loss 0.1 (on CUDA its all-FP32 is 0.057 off the CPU reference). Then merges:
#   bash benchmarks/distributed_gpu4.sh [OUT_DIR]        # OUT_DIR/distributed_gpu4.json, the runs' logs and JSON
set -u
cd "$(dirname "$0")/.."
W=${1:-/tmp/w}; mkdir -p "$W"; nproc > "$W/nproc"; nvidia-smi -L > "$W/gpus"
B=${BUDGET:-48}
zoo=${AUTOPREC_CACHE:-/tmp/autoprec-cache}/zoo
run() {  # name first-gpu gpu-count model max-loss [seed]
  mkdir -p "/tmp/cache-$1" && { [ -d "$zoo" ] && ln -sfn "$zoo" "/tmp/cache-$1/zoo"; }
  echo "start $(date +%T)" > "$W/$1.log"
  AUTOPREC_CACHE=/tmp/cache-$1 timeout 1700 python3 benchmarks/distributed.py --gpus 4 --gpu-counts "$3" \
    --first-gpu "$2" --models "$4" --batch 32 --budget "$B" --max-loss "$5" ${6:+--seed $6} --json "$W/$1.json" >> "$W/$1.log" 2>&1
  echo "rc=$? $(date +%T)" >> "$W/$1.log"
}
run cls1 0 1 ppocr-cls 0.01
run cls4 0 4 ppocr-cls 0.01
run det4 0 4 ppocr-det@8 0.1
run det1 0 1 ppocr-det@8 0.1 &
( run det2 1 2 ppocr-det@8 0.1; run cls2 1 2 ppocr-cls 0.01 ) &
run cls1s1 3 1 ppocr-cls 0.01 1 &
wait
run cls4s1 0 4 ppocr-cls 0.01 1
cd "$W" && python3 "$OLDPWD/benchmarks/distributed.py" --merge cls1.json cls1s1.json cls2.json cls4.json cls4s1.json \
  det1.json det2.json det4.json --json distributed_gpu4.json
