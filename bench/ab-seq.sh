#!/usr/bin/env bash
# bench/ab-seq.sh LABEL CAIRN_BIN [ROUNDS] [POOL]: one A/B sample of 4 MiB
# sequential reads. A fresh release `cairn dev up --osd-size 4G` in a temp
# dir, `rados bench 10 write -b 4M -t 16 --no-cleanup` on POOL (rbd), then
# ROUNDS (2) x `rados bench 10 seq -t 16` of those objects. Prints per
# phase: MB/s, bytes the disk read (whole-machine /proc/diskstats of DISK,
# vda by default: other processes' I/O counts too) per GB served, the
# disk's busy %, the node daemon's and the client's CPU seconds per GB
# (/proc/PID/stat, `time`), and the load average.
#
# CONFIG="key=value ..." sets central config keys and restarts the cluster
# before the phases (e.g. CONFIG="ms_client_mode=crc" or
# CONFIG="osd_cache_written_data=true"). NICE=-15 runs the daemon and the
# client at that niceness (a loaded machine then gives them most of the
# CPU; state it with the figures). Stops what it starts (by PID) and
# removes its temp dir (under BASE_DIR, default /var/tmp).
set -uo pipefail
L=$1 C=$2 R=${3:-2} POOL=${4:-rbd} DISK=${DISK:-vda}
T=$(mktemp -d "${BASE_DIR:-/var/tmp}/abseq.XXXXXX")
PID=""
cleanup() {
  "$C" dev down --dir "$T/dev" >/dev/null 2>&1 || true
  sleep 1
  if [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null; then kill "$PID"; fi
  rm -rf "$T"
}
trap cleanup EXIT
up() {
  nice -n "${NICE:-0}" "$C" dev up --dir "$T/dev" --detach --osd-size 4G >"$T/up.txt" 2>&1 || { cat "$T/up.txt"; exit 1; }
  PID=$(cat "$T/dev/cairn.pid")
  sleep 2
}
up
export CAIRN_CONF=$T/dev/cairn.conf
if [[ -n ${CONFIG:-} ]]; then
  for kv in $CONFIG; do
    "$C" config set global "${kv%%=*}" "${kv#*=}" >/dev/null || exit 1
  done
  "$C" dev down --dir "$T/dev" >/dev/null 2>&1
  for _ in $(seq 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.2; done
  up
fi
cpu() { awk '{print ($14+$15)/100}' "/proc/$PID/stat"; }
# sectors read, sectors written, ms doing I/O
disk() { awk -v d="$DISK" '$3==d{print $6, $10, $13}' /proc/diskstats; }
phase() { # name rados-bench-args...
  local n=$1; shift
  local l0 c0 c1 d0 d1 t0 t1
  l0=$(cut -d' ' -f1 /proc/loadavg); c0=$(cpu); d0=$(disk); t0=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$T/ct" nice -n "${NICE:-0}" "$C" rados -p "$POOL" bench "$@" \
    --format json >"$T/out.json" 2>"$T/err"
  t1=$(date +%s.%N); c1=$(cpu); d1=$(disk)
  python3 - "$L" "$n" "$l0" "$(cut -d' ' -f1 /proc/loadavg)" "$c0" "$c1" "$d0" "$d1" "$t0" "$t1" \
    "$(cat "$T/ct")" "$T/out.json" <<'PY'
import json, sys
L, n, l0, l1, c0, c1, d0, d1, t0, t1, ct, f = sys.argv[1:]
j = json.load(open(f))
d0 = list(map(int, d0.split())); d1 = list(map(int, d1.split()))
wall = float(t1) - float(t0)
mbs = j.get('bandwidth_mb_sec', 0); run = j.get('total_time_run', 0)
gb = max(mbs * run / 1000, 1e-9)
rd = (d1[0] - d0[0]) * 512 / 1e9; util = (d1[2] - d0[2]) / 10 / wall
dc = float(c1) - float(c0); cc = sum(map(float, ct.split()))
print(f"{L} {n} load={l0}..{l1} MB/s={mbs:.1f} disk_read_per_gb={rd / gb:.2f} "
      f"disk_busy={util:.0f}% daemon_cpu_s_per_gb={dc / gb:.2f} client_cpu_s_per_gb={cc / gb:.2f}")
PY
  grep -i error "$T/err" | head -2
}
phase write 10 write -b 4194304 -t 16 --no-cleanup
for i in $(seq "$R"); do phase "seq$i" 10 seq -t 16; done
