#!/usr/bin/env bash
# Bring a PostgreSQL server to a GPU machine that reaches no registry (for distributed.py --gpus):
# Debian's server binaries with their shared libraries (glibc and libstdc++ stay the machine's own)
# and psycopg, ~35 MiB in .gpu/pg, carried in one call.
#
#   here:    benchmarks/gpu_postgres.sh pack      # needs Debian's postgresql package installed here
#   device:  benchmarks/gpu_postgres.sh unpack    # then: export AUTOPREC_PG_LIBS=/opt/pg-libs
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  pack)
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1); version=$(basename "$(dirname "$bin")")
    tmp=$(mktemp -d); mkdir -p "$tmp/opt/pg-libs" .gpu/pg
    for b in postgres initdb pg_ctl; do ldd "$bin/$b"; done | awk '{print $3}' | grep '^/' | sort -u |
      grep -v -E 'libc\.so|libm\.so|libstdc|libgcc_s|ld-linux|libresolv' | xargs -I{} cp -L {} "$tmp/opt/pg-libs/"
    tar -C / -cf "$tmp/pg.tar" "usr/lib/postgresql/$version" "usr/share/postgresql/$version"
    tar -C "$tmp" -rf "$tmp/pg.tar" opt/pg-libs
    xz -T2 -6 -c "$tmp/pg.tar" > .gpu/pg/pg.tar.xz && rm -rf "$tmp"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .gpu/pg psycopg psycopg-binary
    du -sh .gpu/pg | sed 's/^/staged /'
    ;;
  unpack)
    [ -f /opt/pg-libs/.unpacked ] && { echo "postgres: already unpacked"; exit 0; }
    tar -C / -xJf .gpu/pg/pg.tar.xz
    id postgres >/dev/null 2>&1 || useradd -r -M -d /nonexistent postgres
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/pg/*.whl
    touch /opt/pg-libs/.unpacked
    echo "postgres: $(LD_LIBRARY_PATH=/opt/pg-libs /usr/lib/postgresql/*/bin/postgres --version); export AUTOPREC_PG_LIBS=/opt/pg-libs"
    ;;
  *) echo "usage: $0 pack | unpack" >&2; exit 2 ;;
esac
