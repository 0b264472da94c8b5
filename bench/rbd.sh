#!/usr/bin/env bash
# Block-image figures through NBD on a release one-machine dev cluster.
#
#   bench/rbd.sh [OUT_DIR]            # default: ./rbd-results
#
# Starts `cairn dev up` (1 mon + 3 OSDs, pool `rbd` size 3) in a temp dir,
# creates a 4 GiB image (4 MiB objects), serves it with `cairn rbd serve`
# on a loopback port and runs fio's nbd engine against it:
#   - 4 KiB random writes, iodepth 32 (over the first 1 GiB)
#   - 1 MiB sequential writes, iodepth 8 (the first 1 GiB)
#   - 1 MiB sequential reads, iodepth 8 (the same 1 GiB, now written)
# then (as root, with /dev/fuse) the same three through `cairn rbd map` with
# fio's libaio engine on the mapped block device (direct I/O), then
# `cairn rados bench` 4 KiB and 4 MiB writes on the same pool for
# comparison. Each phase runs RUNTIME seconds (default 20). fio's JSON and
# a one-line summary per phase land in OUT_DIR; the summary is also printed.
#
# Knobs: RUNTIME, CAIRN (path to a release `cairn`; built if absent).
# Every process started here is stopped by PID on exit.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
OUT=$(mkdir -p "${1:-$PWD/rbd-results}" && cd "${1:-$PWD/rbd-results}" && pwd)
RUNTIME=${RUNTIME:-20}
log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)" >&2; exit 1; }
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "this fio has no nbd engine" >&2; exit 1; }

if [[ -z ${CAIRN:-} ]]; then
  log "building release cairn"
  (cd "$ROOT" && cargo build --release --bin cairn -q)
  CAIRN=${CARGO_TARGET_DIR:-$ROOT/target}/release/cairn
fi

T=$(mktemp -d "${BASE_DIR:-/tmp}/cairnrbd.XXXXXX")
SERVE=""
MAPPED=""
cleanup() {
  [[ -n $MAPPED ]] && "$CAIRN" rbd unmap "$MAPPED" >/dev/null 2>&1 || true
  if [[ -n $SERVE ]]; then
    kill "$SERVE" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$SERVE" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVE" 2>/dev/null || true
  fi
  "$CAIRN" dev down --dir "$T/dev" >/dev/null 2>&1 || true
  rm -rf "$T"
}
trap cleanup EXIT

log "cairn dev up in $T/dev"
"$CAIRN" dev up --dir "$T/dev" --osd-size 6G --detach >"$OUT/dev_up.txt" 2>&1
export CAIRN_CONF=$T/dev/cairn.conf

"$CAIRN" rbd create bench --size 4G
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$CAIRN" rbd serve bench --listen "127.0.0.1:$PORT" >"$T/serve.out" 2>"$T/serve.err" &
SERVE=$!
for _ in $(seq 200); do grep -q serving "$T/serve.out" 2>/dev/null && break; sleep 0.1; done
grep -q serving "$T/serve.out" || { cat "$T/serve.err" >&2; exit 1; }
URI="nbd://127.0.0.1:$PORT/bench"

run_fio() { # name rw bs iodepth
  local name=$1 rw=$2 bs=$3 depth=$4
  log "fio $name"
  fio --name="$name" --ioengine=nbd --uri="$URI" --rw="$rw" --bs="$bs" \
      --iodepth="$depth" --size=1G --time_based --runtime="$RUNTIME" \
      --output-format=json --output="$OUT/fio_$name.json" >/dev/null
  python3 - "$OUT/fio_$name.json" "$name" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = j["write"] if j["write"]["io_bytes"] else j["read"]
lat = side.get("clat_ns", {}).get("mean", 0) / 1e6
print(f"{sys.argv[2]:<22} {side['iops']:>10.0f} IOPS {side['bw_bytes']/2**20:>9.1f} MiB/s  mean lat {lat:.2f} ms")
EOF
}

{
  echo "# cairn rbd through NBD (fio nbd engine), release dev cluster, runtime ${RUNTIME}s"
  run_fio randwrite-4k-qd32 randwrite 4k 32
  run_fio write-1m-qd8 write 1M 8
  run_fio read-1m-qd8 read 1M 8
} | tee "$OUT/summary.txt"

kill "$SERVE"; wait "$SERVE" 2>/dev/null || true; SERVE=""

# The same through `cairn rbd map` (FUSE + loop here; nbd-client where the
# kernel has nbd), with fio's libaio engine on the block device. Root only.
if [[ $(id -u) == 0 && -e /dev/fuse ]]; then
  export CAIRN_RBD_MAP_DIR=$T/map
  DEV=$("$CAIRN" rbd map bench)
  MAPPED=$DEV
  log "mapped at $DEV"
  run_dev_fio() { # name rw bs iodepth
    log "fio $1 on $DEV"
    fio --name="$1" --filename="$DEV" --ioengine=libaio --direct=1 --rw="$2" --bs="$3" \
        --iodepth="$4" --size=1G --time_based --runtime="$RUNTIME" \
        --output-format=json --output="$OUT/fio_map_$1.json" >/dev/null
    python3 - "$OUT/fio_map_$1.json" "map $1" <<'EOF2'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = j["write"] if j["write"]["io_bytes"] else j["read"]
lat = side.get("clat_ns", {}).get("mean", 0) / 1e6
print(f"{sys.argv[2]:<22} {side['iops']:>10.0f} IOPS {side['bw_bytes']/2**20:>9.1f} MiB/s  mean lat {lat:.2f} ms")
EOF2
  }
  {
    echo "# through cairn rbd map ($DEV, fio libaio direct)"
    run_dev_fio randwrite-4k-qd32 randwrite 4k 32
    run_dev_fio write-1m-qd8 write 1M 8
    run_dev_fio read-1m-qd8 read 1M 8
  } | tee -a "$OUT/summary.txt"
  "$CAIRN" rbd unmap "$DEV"; MAPPED=""
else
  log "not root or no /dev/fuse: skipping the rbd map phase"
fi

log "rados bench on the same pool"
{
  echo "# cairn rados bench, pool rbd, ${RUNTIME}s (4K: 32 in flight, 4M: 16)"
  "$CAIRN" rados -p rbd bench "$RUNTIME" write -b 4096 -t 32 | grep -E "Bandwidth|Average IOPS" | sed 's/^/4K write: /'
  "$CAIRN" rados -p rbd bench "$RUNTIME" write -b 4M -t 16 | grep -E "Bandwidth|Average IOPS" | sed 's/^/4M write: /'
} | tee -a "$OUT/summary.txt"
log "results in $OUT"
