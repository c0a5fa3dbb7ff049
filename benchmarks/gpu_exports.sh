#!/usr/bin/env bash
# The export corpus side by side with AutoCast and whole-model FP16 on every GPU of the machine at once.
# On the GPU machine, after `bash benchmarks/gpu_carry.sh device` (staged with --with DIR, DIR holding wheels/ of
# nvidia-modelopt and what it needs, and corpus/: the Keras models made here with tensorflow):
#
#   bash benchmarks/gpu_exports.sh OUT BATCHES BUDGET MODEL ...     # e.g. $OUT "32 1" 16 resnet50-nhwc-casts-ts ...
#
# The PyTorch models are exported there (its torch, torchvision, transformers), once per machine, into /tmp/corpus;
# models are dealt round-robin to the GPUs, one benchmarks/exports.py process per GPU, each writing
# OUT/exports_gpu_N.json after every model (a call cut short keeps what it measured).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--corpus" ]; then  # only make the corpus (to run in the background while other work runs)
  touch /tmp/corpus.making
  python3 benchmarks/export_corpus.py /tmp/corpus --jobs 8 >/tmp/corpus.log 2>&1 || true
  python3 benchmarks/export_corpus.py /tmp/corpus --add /tmp/carried/corpus >>/tmp/corpus.log 2>&1
  rm -f /tmp/corpus.making; exit 0
fi
out=$1 batches=$2 budget=$3; shift 3
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} AUTOPREC_CACHE=/tmp/autoprec-cache
[ -d /tmp/site/modelopt ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/carried/wheels/*.whl
while [ -f /tmp/corpus.making ]; do sleep 5; done  # made by an earlier call's `gpu_exports.sh --corpus` in the background
if [ ! -f /tmp/corpus/corpus.json ]; then
  python3 benchmarks/export_corpus.py /tmp/corpus --jobs 8 >/dev/null 2>&1 || true
  python3 benchmarks/export_corpus.py /tmp/corpus --add /tmp/carried/corpus
fi
gpus=$(nvidia-smi -L | wc -l)
models=("$@")
for ((g = 0; g < gpus; g++)); do
  mine=()
  for ((i = g; i < ${#models[@]}; i += gpus)); do mine+=("${models[i]}"); done
  [ ${#mine[@]} -eq 0 ] && continue
  python3 benchmarks/exports.py gpu /tmp/corpus --device "$g" --models "${mine[@]}" --batches $batches \
    --budget "$budget" --model-seconds "${MODEL_SECONDS:-900}" --json "$out/exports_gpu_$g.json" >"$out/log_$g.txt" 2>&1 &
done
wait
python3 benchmarks/exports.py report "$out"/exports_gpu_*.json
