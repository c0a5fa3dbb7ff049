#!/bin/bash
# On the GPU machine: the decoder corpus's LLaMA (1024 wide) side by side on ONNX Runtime's CUDA provider —
# autoprec searching with INT4 among its precisions beside whole-model INT4 (RTN and HQQ) and all-FP16.
# The machine reaches no registry and carries 64 MiB a call, so the decoder is exported there (its torch; the
# transformers and optimum wheels come with onnxruntime-gpu), not carried:
#   here:    mkdir -p /tmp/hf/wheels && pip download --no-deps --only-binary=:all: --python-version 3.12 \
#              --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d /tmp/hf/wheels \
#              transformers==4.57.6 optimum==2.1.0 optimum-onnx==0.1.0 huggingface-hub==0.36.2 tokenizers==0.22.2 \
#              safetensors regex requests certifi idna urllib3 charset-normalizer hf-xet onnx-ir==1.1.0
#            benchmarks/gpu_carry.sh stage --with /tmp/hf      # prints the calls
#   device:  bash benchmarks/gpu_carry.sh device && bash benchmarks/decoders_gpu.sh [MAX_LOSS]   # in the last call
# The result's JSON and log go to $OUT.
set -e
cd "$(dirname "$0")/.."
[ -d /tmp/hf-site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/hf-site /tmp/carried/wheels/*.whl
export PYTHONPATH=/tmp/site:/tmp/hf-site:$PYTHONPATH AUTOPREC_CACHE=/tmp/autoprec-cache
nvidia-smi --query-gpu=name --format=csv,noheader
[ -f /tmp/dec/corpus.json ] || python3 benchmarks/decoder_corpus.py /tmp/dec --only llama-1024  # (once per machine)
python3 -m benchmarks decoders /tmp/dec --only llama-1024 --backend ort-cuda --budget 16 --metric cosine \
  --max-loss "${1:-0.0148}" --precisions int4,int8,fp16,fp32 --peers int4_rtn int4_hqq \
  --json "$OUT/decoders_int4_cuda.json" > "$OUT/decoders_int4_cuda.log" 2>&1 || { tail -40 "$OUT/decoders_int4_cuda.log"; exit 1; }
tail -8 "$OUT/decoders_int4_cuda.log"
