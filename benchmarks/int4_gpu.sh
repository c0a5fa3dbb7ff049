#!/bin/bash
# On the GPU machine (after benchmarks/gpu_carry.sh's calls, in the last: `bash benchmarks/gpu_carry.sh device &&
# bash benchmarks/int4_gpu.sh`): a one-layer decoder 1024 wide with a 32000-token head (tests/builders.kv_decoder),
# its data (5 tokens after a past of 6), searched on ort-cuda with INT4 among the precisions; the result's JSON to
# $OUT (benchmarks/results/int4_cuda_h200/).
set -e
export PYTHONPATH=/tmp/site:$PYTHONPATH
cd "$(dirname "$0")/.."
python3 - <<'PY'
import sys; sys.path.insert(0, "tests")
import builders, numpy as np
m = builders.save(builders.kv_decoder(hidden=1024, vocab=32000, positions=256), __import__("pathlib").Path("/tmp/dec.onnx"))
builders.decoder_data(m, __import__("pathlib").Path("/tmp/dec.npz"), items=16)
print("made")
PY
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c 'import sys; from autoprec.app.cli import main; sys.exit(main())' search /tmp/dec.onnx --data /tmp/dec.npz --backend ort-cuda --precisions int4,int8,fp16,fp32 \
  --metric cosine --max-loss 0.02 --budget 12 --no-progress --out /tmp/i4 > $OUT/search.log 2>&1 || true
mkdir -p $OUT/i4; cp /tmp/i4/*.json /tmp/i4/*.png $OUT/i4/ 2>/dev/null || true; cp /tmp/i4/best/plan.json $OUT/i4/best_plan.json 2>/dev/null || true
tail -30 $OUT/search.log
