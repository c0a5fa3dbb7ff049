#!/usr/bin/env bash
# Issue 54's four-GPU measurement (docs/workers.md), on one host with 4 GPUs, after `benchmarks/gpu_carry.sh device`
# (onnxruntime-gpu, zoo:ppocr-cls and zoo:ppocr-det, PostgreSQL). Every run ALONE on the host, one after another,
# each a process of its own with its own PostgreSQL server and autoprec cache: ppocr-det at 4 GPUs (first, on the
# fresh machine), at 1 GPU, ppocr-cls at 1 and at 4 GPUs, ppocr-det at 4 GPUs again (the 1-GPU run between two 4-GPU
# ones: the machine's drift shows as their difference); then, if RUN_TWO=1, both models at 2 GPUs. ppocr-det at
# batch 8 with --max-loss 0.1 (on CUDA its all-FP32 is 0.057 off the CPU reference). About 25 minutes; then merges:
#   bash benchmarks/distributed_gpu4.sh [OUT_DIR]        # OUT_DIR/distributed_gpu4.json, the runs' logs and JSON
set -u
cd "$(dirname "$0")/.."
W=${1:-/tmp/w}; mkdir -p "$W"; nproc > "$W/nproc"; nvidia-smi -L > "$W/gpus"
B=${BUDGET:-48}
zoo=${AUTOPREC_CACHE:-/tmp/autoprec-cache}/zoo
run() {  # name gpu-count model max-loss
  mkdir -p "/tmp/cache-$1" && { [ -d "$zoo" ] && ln -sfn "$zoo" "/tmp/cache-$1/zoo"; }
  echo "start $(date +%T)" > "$W/$1.log"
  AUTOPREC_CACHE=/tmp/cache-$1 timeout 1700 python3 benchmarks/distributed.py --gpus 4 --gpu-counts "$2" \
    --models "$3" --batch 32 --budget "$B" --max-loss "$4" --json "$W/$1.json" >> "$W/$1.log" 2>&1
  echo "rc=$? $(date +%T)" >> "$W/$1.log"
}
run det4 4 ppocr-det@8 0.1
run det1 1 ppocr-det@8 0.1
run cls1 1 ppocr-cls 0.01
run cls4 4 ppocr-cls 0.01
run det4b 4 ppocr-det@8 0.1
runs=(det1.json det4.json det4b.json cls1.json cls4.json)
if [ "${RUN_TWO:-0}" = 1 ]; then run det2 2 ppocr-det@8 0.1; run cls2 2 ppocr-cls 0.01; runs+=(det2.json cls2.json); fi
cd "$W" && python3 "$OLDPWD/benchmarks/distributed.py" --merge "${runs[@]}" --json distributed_gpu4.json
