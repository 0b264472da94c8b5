#!/usr/bin/env bash
# Cairn beside Ceph 16 and the raw disk, in one sitting on one machine.
#
#   bench/compare.sh [OUT_DIR]          # default: ./compare-results
#
# 1. Ceph: ../shared/peers/ceph/run.sh (fio raw-disk baseline, a 1-mon/1-mgr/
#    3-OSD cluster on loopback, rados bench on a size-3 pool and an EC 2+1
#    pool; no radosgw) — its raw outputs land in OUT_DIR/ceph.
# 2. Cairn: a release `cairn dev up` in a temp dir on the same filesystem
#    (1 mon + 3 OSDs in one node daemon, pools `rbd` size 3 and `ec21`), timed
#    to all PGs active+clean, then the same rados bench phases with the same
#    flags, sampling the daemon's RSS every second.
# 3. bench/compare.py prints one table with every figure and the ratio
#    Cairn / Ceph (and against fio where the issue asks), into
#    OUT_DIR/COMPARE.md.
#
# Knobs: BENCH_SECS (default 30, as Ceph's script), CEPH_PEER (path to
# run.sh), SKIP_CEPH=1 (reuse OUT_DIR/ceph from an earlier run in the same
# sitting), CAIRN (path to a release `cairn` binary; built if absent),
# CAIRN_OSD_SIZE (`dev up --osd-size`, e.g. 4G when the disk is short; the
# default 10G preallocates 30 GB).
# Every process started here is stopped by PID on exit.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
OUT=$(mkdir -p "${1:-$PWD/compare-results}" && cd "${1:-$PWD/compare-results}" && pwd)
BENCH_SECS=${BENCH_SECS:-30}
CEPH_PEER=${CEPH_PEER:-$ROOT/../shared/peers/ceph/run.sh}
log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

if [[ ${SKIP_CEPH:-0} != 1 ]]; then
  log "Ceph peer run (fio baseline + rados bench), output in $OUT/ceph"
  (cd "$OUT" && OUT_DIR="$OUT/ceph" WITH_RGW=0 BENCH_SECS=$BENCH_SECS bash "$CEPH_PEER") \
    || log "Ceph peer run failed (rc $?); the table will lack Ceph figures"
fi

if [[ -z ${CAIRN:-} ]]; then
  log "building release cairn"
  (cd "$ROOT" && cargo build --release --bin cairn -q)
  CAIRN=$ROOT/target/release/cairn
fi

RAW=$OUT/cairn
rm -rf "$RAW" && mkdir -p "$RAW"
T=$(mktemp -d "${BASE_DIR:-/tmp}/cairnbench.XXXXXX")
SAMPLER=""
cleanup() {
  [[ -n $SAMPLER ]] && kill "$SAMPLER" 2>/dev/null || true
  "$CAIRN" dev down --dir "$T/dev" >/dev/null 2>&1 || true
  rm -rf "$T"
}
trap cleanup EXIT

echo setup >"$T/phase"
log "cairn dev up (timed to all PGs active+clean)"
t0=$(date +%s.%N)
"$CAIRN" dev up --dir "$T/dev" --detach ${CAIRN_OSD_SIZE:+--osd-size "$CAIRN_OSD_SIZE"} 2>&1 | tee "$RAW/dev_up.txt"
t1=$(date +%s.%N)
echo "dev_up_active_clean $(echo "$t1 - $t0" | bc)" >"$RAW/timings.txt"
export CAIRN_CONF=$T/dev/cairn.conf
PID=$(cat "$T/dev/cairn.pid")
echo "daemon_pid $PID" >>"$RAW/timings.txt"

# RSS sampler: "<epoch> <phase> <VmRSS kB>" once per second.
(
  trap 'exit 0' TERM
  while :; do
    rss=$(awk '/^VmRSS:/{print $2}' "/proc/$PID/status" 2>/dev/null || true)
    [[ -n $rss ]] && echo "$(date +%s) $(<"$T/phase") $rss"
    sleep 1
  done
) >>"$RAW/rss.txt" 2>/dev/null &
SAMPLER=$!

"$CAIRN" status >"$RAW/status_before.txt" 2>&1 || true
"$CAIRN" osd pool ls detail >"$RAW/pools.txt" 2>&1 || true

rbench() {  # phase pool args...
  local phase=$1 pool=$2; shift 2
  log "cairn rados bench $phase: $*"
  echo "$phase" >"$T/phase"
  timeout $((BENCH_SECS + 180)) "$CAIRN" rados -p "$pool" bench "$BENCH_SECS" "$@" \
    >"$RAW/rados_$phase.txt" 2>&1 || log "phase $phase failed (see $RAW/rados_$phase.txt)"
  echo idle >"$T/phase"
}

sleep 5
rbench rep3_write_4M rbd write -b 4194304 -t 16 --no-cleanup --run-name r4m
rbench rep3_seq_4M rbd seq -t 16 --run-name r4m
"$CAIRN" rados -p rbd cleanup --run-name r4m >"$RAW/rados_rep3_cleanup_4M.txt" 2>&1 || true
rbench rep3_write_4K rbd write -b 4096 -t 64 --no-cleanup --run-name r4k
rbench rep3_rand_4K rbd rand -t 64 --run-name r4k
if "$CAIRN" osd pool ls 2>/dev/null | grep -qx ec21; then
  rbench ec21_write_4M ec21 write -b 4194304 -t 16 --no-cleanup --run-name e4m
  rbench ec21_seq_4M ec21 seq -t 16 --run-name e4m
  "$CAIRN" rados -p ec21 cleanup --run-name e4m >"$RAW/rados_ec21_cleanup_4M.txt" 2>&1 || true
else
  log "no ec21 pool in this build: EC phases skipped"
fi
"$CAIRN" status >"$RAW/status_after.txt" 2>&1 || true
awk '/^VmHWM:/{print "vmhwm_kb", $2}' "/proc/$PID/status" >>"$RAW/timings.txt" 2>/dev/null || true

python3 "$HERE/compare.py" --ceph "$OUT/ceph/raw" --cairn "$RAW" --peer "$(dirname "$CEPH_PEER")" --out "$OUT/COMPARE.md"
log "report: $OUT/COMPARE.md"
