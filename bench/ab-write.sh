#!/usr/bin/env bash
# bench/ab-write.sh LABEL CAIRN_BIN [SECONDS]: one A/B sample of the
# replicated write path. A fresh release `cairn dev up --osd-size 2G` in a
# temp dir, `rados bench SECONDS write` on pool rbd (size 3) at 4 MiB -t 16
# then 4 KiB -t 64; prints per phase the load average, the node daemon's
# and the client's CPU seconds, the daemon's peak RSS and the JSON summary.
# Run it alternately with the old and the new binary.
# Env: POOL (default rbd; ec21 for the EC 2+1 pool), PHASES (default
# "w4m w4k"), PERF_DIR (if set: `perf record -F 499 -g` of the daemon for
# PERF_SECS, default 8, from 3 s into the PERF_PHASE phase (default w4m),
# to PERF_DIR/LABEL-POOL-PHASE.data, and of the client to
# PERF_DIR/LABEL-POOL-PHASE-client.data; PERF_ARGS, default -g, e.g.
# "--call-graph dwarf,16384"; needs perf), CLUSTER_MODE (if set: `config
# set global ms_cluster_mode CLUSTER_MODE` and a restart of the dev cluster
# before the phases, to compare crc and secure with one binary), CLIENT (the
# binary that runs `rados bench`, default CAIRN_BIN: one client for both
# sides when only the daemon differs), CONFIG
# ("key=value ..." for global, the same way), SETTLE_SECS (idle seconds
# before the first phase, default 3; with osd_zero_unwritten the OSDs zero
# unwritten free space while idle), OSD_SIZE (default 2G). A phase may
# repeat (PHASES="w4m w4m": the second run writes where the first run's
# cleanup freed blocks). Besides CPU, each phase prints the bytes the daemon
# wrote (`/proc/PID/io` write_bytes: its own data, WAL and metadata writes),
# the sectors the filesystem's disk wrote (`/proc/diskstats`: the journal
# and every other process on the disk too) and how busy the machine's CPUs
# were (`/proc/stat`). Set-up and clean-up: bench/ab-common.sh.
set -uo pipefail
L=$1 C=$2 S=${3:-10}
POOL=${POOL:-rbd} PHASES=${PHASES:-w4m w4k}
. "$(dirname "$0")/ab-common.sh"
ab_init abwrite
ab_up "${OSD_SIZE:-2G}" 0
if [[ -n ${CLUSTER_MODE:-} ]]; then
  ab_restart_with global "ms_cluster_mode=$CLUSTER_MODE" "${OSD_SIZE:-2G}" 0
  L="$L($CLUSTER_MODE)"
fi
ab_restart_with global "${CONFIG:-}" "${OSD_SIZE:-2G}" 0
sleep "${SETTLE_SECS:-3}"
# The disk under $T (major minor, as /proc/diskstats names it).
DEV=$(stat -c '%Hd %Ld' "$T")
disk_sectors() { awk -v d="$DEV" '$1" "$2==d{print $10}' /proc/diskstats; }
daemon_wbytes() { awk '/^write_bytes:/{print $2}' "/proc/$PID/io"; }
cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8, $5+$6}' /proc/stat; }
phase() { # name rados-bench-args...
  local n=$1; shift
  local l0 c0 c1 l1 hwm d0 d1 w0 w1 t0 t1
  l0=$(cut -d' ' -f1 /proc/loadavg); c0=$(ab_cpu)
  d0=$(disk_sectors); w0=$(daemon_wbytes); t0=$(cpu_ticks)
  /usr/bin/time -f "%U %S" -o "$T/ct_$n" timeout $((S + 120)) "${CLIENT:-$C}" rados -p "$POOL" bench "$S" write "$@" \
    --no-cleanup --run-name "$n" --format json >"$T/out_$n.json" 2>"$T/err_$n" &
  local bench_pid=$! perf_pids=""
  if [[ -n ${PERF_DIR:-} && $n == "${PERF_PHASE:-w4m}" ]]; then
    mkdir -p "$PERF_DIR"
    sleep 3
    # The client: the bench under `time` and `timeout`.
    local cpid
    cpid=$(pgrep -P "$(pgrep -P "$bench_pid" | head -1)" | head -1)
    perf record -q -F 499 ${PERF_ARGS:--g} -p "$PID" -o "$PERF_DIR/$L-$POOL-$n.data" -- sleep "${PERF_SECS:-8}" >/dev/null 2>&1 &
    perf_pids=$!
    if [[ -n $cpid ]]; then
      perf record -q -F 499 ${PERF_ARGS:--g} -p "$cpid" -o "$PERF_DIR/$L-$POOL-$n-client.data" -- sleep "${PERF_SECS:-8}" \
        >/dev/null 2>&1 &
      perf_pids="$perf_pids $!"
    fi
  fi
  wait "$bench_pid"
  c1=$(ab_cpu); l1=$(cut -d' ' -f1 /proc/loadavg)
  d1=$(disk_sectors); w1=$(daemon_wbytes); t1=$(cpu_ticks)
  [[ -n $perf_pids ]] && wait $perf_pids
  hwm=$(awk '/^VmHWM:/{print $2}' "/proc/$PID/status")
  echo "$L $POOL $n load=$l0..$l1 daemon_cpu_s=$(echo "$c1 - $c0" | bc) client_cpu_s=$(awk '{print $1+$2}' "$T/ct_$n") daemon_hwm_kb=$hwm \
daemon_write_mb=$(((w1 - w0) / 1000000)) disk_write_mb=$(((${d1:-0} - ${d0:-0}) * 512 / 1000000)) \
cpu_busy_pct=$(echo "$t0 $t1" | awk '{t = $3 - $1; printf "%.0f", t ? 100 * (t - ($4 - $2)) / t : 0}') $(tr -d '\n' <"$T/out_$n.json")"
  "$C" rados -p "$POOL" cleanup --run-name "$n" >/dev/null 2>&1 || true
}
for p in $PHASES; do
  case $p in
    w4m) phase w4m -b 4194304 -t 16 ;;
    w4k) phase w4k -b 4096 -t 64 ;;
    *) echo "unknown phase $p (w4m, w4k)" >&2; exit 2 ;;
  esac
done
