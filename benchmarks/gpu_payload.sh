#!/usr/bin/env bash
# Bring zoo models to a GPU machine that reaches no registry, in parts small enough to ride along
# with each call to a GPU machine that carries at most 64 MiB of files per command.
#
#   here:    benchmarks/gpu_payload.sh pack [MODEL ...]   # fetches them, writes .gpu/pay1 .. .gpu/payN
#   device:  benchmarks/gpu_payload.sh unpack             # collects carried parts; unpacks once all are there
#            export AUTOPREC_CACHE=/tmp/autoprec-cache
#
# Each part is PART (default 14M) so that part + .gpu/small + an onnxruntime-gpu part + the working
# tree stay under the 64 MiB a call carries. Only what a search needs travels: model.onnx,
# data.npz, NOTICE.txt, source.json (not MiniLM's checkpoint or wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
PART=${PART:-14M}
case "${1:-}" in
  pack)
    shift
    models=("$@")
    [ ${#models[@]} -gt 0 ] || models=(ppocr-det ppocr-rec yolov8n minilm)
    cache=${AUTOPREC_CACHE:-$HOME/.cache/autoprec}
    for m in "${models[@]}"; do autoprec zoo fetch "$m" >/dev/null; done
    files=()
    for m in "${models[@]}"; do
      for f in model.onnx data.npz NOTICE.txt source.json; do files+=("zoo/$m/$f"); done
    done
    rm -rf .gpu/pay[0-9]* && mkdir -p .gpu
    tmp=$(mktemp -d)
    tar -C "$cache" -cf "$tmp/payload.tar" "${files[@]}"
    sha256sum "$tmp/payload.tar" | cut -d' ' -f1 > "$tmp/SHA256"
    split -b "$PART" -d "$tmp/payload.tar" "$tmp/payload.part_"
    i=1
    for p in "$tmp"/payload.part_*; do mkdir -p ".gpu/pay$i"; mv "$p" ".gpu/pay$i/"; cp "$tmp/SHA256" ".gpu/pay$i/"; i=$((i+1)); done
    rm -rf "$tmp"
    du -sh .gpu/pay* | sed 's/^/staged /'
    echo "parts: $((i-1)); carry one or more .gpu/payK per call, then run: benchmarks/gpu_payload.sh unpack"
    ;;
  unpack)
    mkdir -p /tmp/autoprec-payload /tmp/autoprec-cache
    for d in .gpu/pay[0-9]*; do [ -d "$d" ] && cp -n "$d"/payload.part_* "$d"/SHA256 /tmp/autoprec-payload/ 2>/dev/null || true; done
    if [ -f /tmp/autoprec-cache/.unpacked ]; then echo "payload: already unpacked in /tmp/autoprec-cache"; exit 0; fi
    [ -f /tmp/autoprec-payload/SHA256 ] || { echo "payload: no part carried yet"; exit 0; }
    have=$(cat /tmp/autoprec-payload/payload.part_* | sha256sum | cut -d' ' -f1)
    if [ "$have" = "$(cat /tmp/autoprec-payload/SHA256)" ]; then
      cat /tmp/autoprec-payload/payload.part_* | tar -C /tmp/autoprec-cache -xf -
      touch /tmp/autoprec-cache/.unpacked
      echo "payload: unpacked into /tmp/autoprec-cache: $(ls /tmp/autoprec-cache/zoo | tr '\n' ' ')"
    else
      echo "payload: have $(ls /tmp/autoprec-payload | grep -c part_) part(s); carry the rest"
    fi
    ;;
  *) echo "usage: $0 pack [MODEL ...] | unpack" >&2; exit 2 ;;
esac
