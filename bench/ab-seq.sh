#!/usr/bin/env bash
# bench/ab-seq.sh LABEL CAIRN_BIN [ROUNDS] [POOL]: one A/B sample of 4 MiB
# sequential reads. A fresh release `cairn dev up --osd-size 4G` in a temp
# dir (OSD_SIZE=8G on a quiet machine: 10 s of writes fill 4G OSDs),
# `rados bench 10 write -b 4M -t 16 --no-cleanup` on POOL (rbd), then
# ROUNDS (2) x `rados bench 10 seq -t 16` of those objects. Prints per
# phase: MB/s, bytes the disk read (whole-machine /proc/diskstats of DISK,
# vda by default: other processes' I/O counts too) per GB served, the
# disk's busy %, the node daemon's and the client's CPU seconds per GB
# (/proc/PID/stat, `time`), and the load average. CLIENT=path runs the
# rados bench client from another binary than the daemon.
#
# CONFIG="key=value ..." sets central config keys and restarts the cluster
# before the phases (e.g. CONFIG="ms_client_mode=secure" or
# CONFIG="osd_cache_written_data=true"; lists with commas: "crc,secure").
# NICE=-15 runs the daemon and the client at that niceness (a loaded
# machine then gives them most of the CPU; state it with the figures). Set-up and clean-up: bench/ab-common.sh
# (stops what it starts, by PID; removes its temp dir under BASE_DIR,
# default /var/tmp).
set -uo pipefail
L=$1 C=$2 R=${3:-2} POOL=${4:-rbd} DISK=${DISK:-vda}
. "$(dirname "$0")/ab-common.sh"
ab_init abseq
ab_up "${OSD_SIZE:-4G}" 2
ab_restart_with global "${CONFIG:-}" 4G 2
# sectors read, sectors written, ms doing I/O
disk() { awk -v d="$DISK" '$3==d{print $6, $10, $13}' /proc/diskstats; }
phase() { # name rados-bench-args...
  local n=$1; shift
  local l0 c0 c1 d0 d1 t0 t1
  l0=$(cut -d' ' -f1 /proc/loadavg); c0=$(ab_cpu); d0=$(disk); t0=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$T/ct" nice -n "${NICE:-0}" "${CLIENT:-$C}" rados -p "$POOL" bench "$@" \
    --format json >"$T/out.json" 2>"$T/err"
  t1=$(date +%s.%N); c1=$(ab_cpu); d1=$(disk)
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
