#!/usr/bin/env bash
# bench/ab-write.sh LABEL CAIRN_BIN [SECONDS]: one A/B sample of the
# replicated write path. A fresh release `cairn dev up --osd-size 2G` in a
# temp dir, `rados bench SECONDS write` on pool rbd (size 3) at 4 MiB -t 16
# then 4 KiB -t 64; prints per phase the load average, the node daemon's
# and the client's CPU seconds, the daemon's peak RSS and the JSON summary.
# Run it alternately with the old and the new binary. Stops what it starts
# (by PID) and removes its temp dir.
# Env: POOL (default rbd; ec21 for the EC 2+1 pool), PHASES (default
# "w4m w4k"), PERF_DIR (if set: `perf record -F 499 -g` of the daemon for
# PERF_SECS, default 8, from 3 s into the w4m phase, to
# PERF_DIR/LABEL-POOL-w4m.data; needs perf), CLUSTER_MODE (if set: `config
# set global ms_cluster_mode CLUSTER_MODE` and a restart of the dev cluster
# before the phases, to compare crc and secure with one binary).
set -uo pipefail
L=$1 C=$2 S=${3:-10}
POOL=${POOL:-rbd} PHASES=${PHASES:-w4m w4k}
T=$(mktemp -d "${BASE_DIR:-/var/tmp}/abwrite.XXXXXX")
PID=""
cleanup() {
  "$C" dev down --dir "$T/dev" >/dev/null 2>&1 || true
  sleep 1
  if [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null; then kill "$PID"; fi
  rm -rf "$T"
}
trap cleanup EXIT
"$C" dev up --dir "$T/dev" --detach --osd-size "${OSD_SIZE:-2G}" >"$T/up.txt" 2>&1 || { cat "$T/up.txt"; exit 1; }
export CAIRN_CONF=$T/dev/cairn.conf
if [[ -n ${CLUSTER_MODE:-} ]]; then
  "$C" config set global ms_cluster_mode "$CLUSTER_MODE" >/dev/null || exit 1
  "$C" dev down --dir "$T/dev" >/dev/null 2>&1
  "$C" dev up --dir "$T/dev" --detach >"$T/up2.txt" 2>&1 || { cat "$T/up2.txt"; exit 1; }
  L="$L($CLUSTER_MODE)"
fi
PID=$(cat "$T/dev/cairn.pid")
cpu() { awk '{print ($14+$15)/100}' "/proc/$PID/stat"; }
sleep 3
phase() { # name rados-bench-args...
  local n=$1; shift
  local l0 c0 c1 l1 hwm
  l0=$(cut -d' ' -f1 /proc/loadavg); c0=$(cpu)
  local perf_pid=""
  if [[ -n ${PERF_DIR:-} && $n == w4m ]]; then
    mkdir -p "$PERF_DIR"
    (sleep 3; exec perf record -q -F 499 -g -p "$PID" -o "$PERF_DIR/$L-$POOL-$n.data" -- sleep "${PERF_SECS:-8}") \
      >/dev/null 2>&1 &
    perf_pid=$!
  fi
  /usr/bin/time -f "%U %S" -o "$T/ct_$n" timeout $((S + 120)) "$C" rados -p "$POOL" bench "$S" write "$@" \
    --no-cleanup --run-name "$n" --format json >"$T/out_$n.json" 2>"$T/err_$n"
  c1=$(cpu); l1=$(cut -d' ' -f1 /proc/loadavg)
  [[ -n $perf_pid ]] && wait "$perf_pid"
  hwm=$(awk '/^VmHWM:/{print $2}' "/proc/$PID/status")
  echo "$L $POOL $n load=$l0..$l1 daemon_cpu_s=$(echo "$c1 - $c0" | bc) client_cpu_s=$(awk '{print $1+$2}' "$T/ct_$n") daemon_hwm_kb=$hwm $(tr -d '\n' <"$T/out_$n.json")"
  "$C" rados -p "$POOL" cleanup --run-name "$n" >/dev/null 2>&1 || true
}
for p in $PHASES; do
  case $p in
    w4m) phase w4m -b 4194304 -t 16 ;;
    w4k) phase w4k -b 4096 -t 64 ;;
    *) echo "unknown phase $p (w4m, w4k)" >&2; exit 2 ;;
  esac
done
