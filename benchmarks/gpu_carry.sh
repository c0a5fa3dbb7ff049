#!/usr/bin/env bash
# Everything a GPU machine without a registry needs, in the fewest calls: onnxruntime-gpu (unzipped and
# xz-compressed: 203 MiB instead of the wheel's 244), the small wheels autoprec needs there, zoo models
# with their data, and optionally a PostgreSQL server (gpu_postgres.sh), all in ONE stream cut into parts
# that each fit a call beside .gpu/small and the working tree (64 MiB a call).
#
#   here:    benchmarks/gpu_carry.sh stage [--postgres] [--with DIR] [ZOO_MODEL ...]   # prints the calls to make
#            (--with DIR: a folder of your own, e.g. AutoCast's models, unpacked at /tmp/carried on the device)
#   device:  bash benchmarks/gpu_carry.sh device                           # first in every call (it is idempotent)
#            export PYTHONPATH=/tmp/site:$PYTHONPATH AUTOPREC_CACHE=/tmp/autoprec-cache
#
# onnxruntime-gpu alone: 4 calls (the wheel in parts took 5); with the four GPU zoo models: 5 (took 6+).
# Zoo models and DIR's models carry each large tensor once (carry_weights.py): all eight zoo models with
# AutoCast's 16 models of them take 7 calls instead of 12.
# The machine goes back after 30 s idle and /tmp with it: make the calls back to back.
set -euo pipefail
cd "$(dirname "$0")/.."
ORT_VERSION=${ORT_VERSION:-1.31.1}
PART=${PART:-48M}  # a call carries 64 MiB: the part, .gpu/small (6 MiB) and the working tree (7 MiB)
case "${1:-}" in
  stage)
    shift
    postgres=0; models=(); with=""
    while [ $# -gt 0 ]; do
      case "$1" in --postgres) postgres=1 ;; --with) with=$2; shift ;; *) models+=("$1") ;; esac
      shift
    done
    exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
    grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
    plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
    rm -rf .gpu/small .gpu/part[0-9]* && mkdir -p .gpu/small .gpu/full .gpu/stream
    python3 -m pip download -q --no-deps "${plat[@]}" -d .gpu/small optuna alembic sqlalchemy colorlog mako greenlet onnx-graphsurgeon
    if [ ! -f ".gpu/full/ort-$ORT_VERSION.tar.xz" ]; then  # once: about 3 minutes on 2 cores
      python3 -m pip download -q --no-deps "${plat[@]}" -d .gpu/full "onnxruntime-gpu==$ORT_VERSION"
      tmp=$(mktemp -d); python3 -m zipfile -e .gpu/full/onnxruntime_gpu-"$ORT_VERSION"-*.whl "$tmp"
      tar -C "$tmp" -cf - . | xz -T0 -6 > ".gpu/full/ort-$ORT_VERSION.tar.xz.tmp" && rm -rf "$tmp"
      mv ".gpu/full/ort-$ORT_VERSION.tar.xz.tmp" ".gpu/full/ort-$ORT_VERSION.tar.xz"
    fi
    rm -rf .gpu/stream/* && cp ".gpu/full/ort-$ORT_VERSION.tar.xz" .gpu/stream/ort.tar.xz
    if [ ${#models[@]} -gt 0 ] || [ -n "$with" ]; then  # zoo models and DIR, their shared weights carried once
      cache=${AUTOPREC_CACHE:-$HOME/.cache/autoprec}; rm -rf .gpu/models && mkdir -p .gpu/models/zoo .gpu/models/with
      for m in "${models[@]}"; do
        autoprec zoo fetch "$m" >/dev/null && mkdir -p ".gpu/models/zoo/$m"
        for f in model.onnx data.npz NOTICE.txt source.json; do cp "$cache/zoo/$m/$f" ".gpu/models/zoo/$m/"; done
      done
      [ -n "$with" ] && cp -r "$with"/. .gpu/models/with/
      python3 benchmarks/carry_weights.py pack .gpu/models
      tar -C .gpu/models -cf .gpu/stream/models.tar . && rm -rf .gpu/models
    fi
    [ "$postgres" = 1 ] && { benchmarks/gpu_postgres.sh pack >/dev/null; cp .gpu/pg/* .gpu/stream/; }
    tar -C .gpu/stream -cf .gpu/carry.tar . && sha256sum .gpu/carry.tar | cut -d' ' -f1 > .gpu/small/CARRY_SHA256
    split -b "$PART" -d .gpu/carry.tar .gpu/carry.part_ && rm .gpu/carry.tar
    i=1; for p in .gpu/carry.part_*; do mkdir -p ".gpu/part$i"; mv "$p" ".gpu/part$i/"; i=$((i + 1)); done
    n=$((i - 1))
    echo "staged: $(du -sh .gpu/small | cut -f1) small wheels + $n part(s) of $PART; make these calls, back to back:"
    for k in $(seq 1 "$n"); do
      echo "  call $k: carry [\".gpu/small\", \".gpu/part$k\"]  command: bash benchmarks/gpu_carry.sh device$([ "$k" = "$n" ] && echo ' && <your work>')"
    done
    ;;
  device)
    mkdir -p /tmp/carry /tmp/site /tmp/autoprec-cache
    for d in .gpu/part[0-9]*; do [ -d "$d" ] && cp -n "$d"/carry.part_* /tmp/carry/ 2>/dev/null || true; done
    if [ -f /tmp/site/.carried ]; then echo "carry: already installed"; exit 0; fi
    if [ "$(cat /tmp/carry/carry.part_* 2>/dev/null | sha256sum | cut -d' ' -f1)" != "$(cat .gpu/small/CARRY_SHA256)" ]; then
      echo "carry: have $(ls /tmp/carry | wc -l) part(s); carry the next .gpu/partK"; exit 0
    fi
    mkdir -p /tmp/stream && cat /tmp/carry/carry.part_* | tar -C /tmp/stream -xf -
    xz -dc /tmp/stream/ort.tar.xz | tar -C /tmp/site -xf -
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/small/*.whl
    if [ -f /tmp/stream/models.tar ]; then
      mkdir -p /tmp/models && tar -C /tmp/models -xf /tmp/stream/models.tar && python3 benchmarks/carry_weights.py unpack /tmp/models
      mkdir -p /tmp/autoprec-cache/zoo /tmp/carried && cp -r /tmp/models/zoo/. /tmp/autoprec-cache/zoo/ && cp -r /tmp/models/with/. /tmp/carried/
    fi
    if [ -f /tmp/stream/pg.tar.xz ]; then
      tar -C / -xJf /tmp/stream/pg.tar.xz
      id postgres >/dev/null 2>&1 || useradd -r -M -d /nonexistent postgres
      python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/stream/psycopg*.whl
    fi
    PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
    touch /tmp/site/.carried
    echo "carry: onnxruntime-gpu $(PYTHONPATH=/tmp/site python3 -c 'import onnxruntime as o; print(o.__version__)') in /tmp/site$( \
      [ -d /tmp/autoprec-cache/zoo ] && echo "; zoo: $(ls /tmp/autoprec-cache/zoo | tr '\n' ' ')")$( \
      [ -f /tmp/stream/pg.tar.xz ] && echo '; PostgreSQL: export AUTOPREC_PG_LIBS=/opt/pg-libs')"
    ;;
  *) echo "usage: $0 stage [--postgres] [--with DIR] [ZOO_MODEL ...] | device" >&2; exit 2 ;;
esac
