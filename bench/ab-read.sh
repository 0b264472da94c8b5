#!/usr/bin/env bash
# bench/ab-read.sh LABEL CAIRN_BIN [SECONDS]: one A/B sample of the
# replicated read path. A fresh release `cairn dev up --osd-size 4G` in a
# temp dir (OSDs of 4G); on pool rbd (size 3), in bench/compare.sh's
# order: `rados bench` 4 MiB -t 16 writes for W4M_SECS (4), `seq` reads of
# them for SECONDS, 4 KiB -t 64 writes for W4K_SECS (20), `rand` reads of
# them for SECONDS. Prints per phase the load average, the node daemon's and the
# client's CPU seconds, the daemon's CPU per op (us) or per GB (s) less
# its idle CPU over the phase (measured for 5 s before), its peak RSS and
# the JSON summary.
#
# CACHE_BYTES=N restarts the cluster with `osd_data_cache_bytes N` (0: the
# data cache off) before the phases; CONFIG="key=value ..." sets central
# config keys for global the same way (e.g. CONFIG="ms_client_mode=secure";
# lists with commas). PERF=1 runs `perf stat` on the
# daemon during each read phase (task-clock, context switches). Run it
# alternately with the builds (or settings) to compare. Set-up and
# clean-up: bench/ab-common.sh.
set -uo pipefail
L=$1 C=$2 S=${3:-10}
. "$(dirname "$0")/ab-common.sh"
ab_init abread
ab_up 4G 3
phase() { # name mode ops-or-bytes rados-bench-args...
  local n=$1 mode=$2 unit=$3; shift 3
  local l0 c0 c1 l1 hwm d per perfpid=""
  l0=$(cut -d' ' -f1 /proc/loadavg); c0=$(ab_cpu)
  if [[ ${PERF:-0} == 1 && $mode != write ]]; then
    perf stat -e task-clock,context-switches,cpu-migrations -p "$PID" -o "$T/perf_$n" &
    perfpid=$!
  fi
  /usr/bin/time -f "%U %S" -o "$T/ct_$n" timeout $((S + 120)) "$C" rados -p rbd bench "$S" "$mode" "$@" \
    --format json >"$T/out_$n.json" 2>"$T/err_$n"
  if [[ -n $perfpid ]]; then kill -INT "$perfpid"; wait "$perfpid"; fi
  c1=$(ab_cpu); l1=$(cut -d' ' -f1 /proc/loadavg)
  hwm=$(awk '/^VmHWM:/{print $2}' "/proc/$PID/status")
  d=$(echo "$c1 - $c0" | bc)
  # Less what the daemon spends idle (ticks, heartbeats, stats) over the
  # same time: at a few thousand ops per second on a loaded machine that
  # is a large share.
  d=$(echo "$d - $IDLE_CPU_PER_S * $(python3 -c "import json; print(json.load(open('$T/out_$n.json')).get('total_time_run',0))")" | bc)
  if [[ $unit == ops ]]; then
    # CPU microseconds per op: ops = IOPS x seconds run.
    per="us_per_op=$(python3 -c "import json,sys; j=json.load(open('$T/out_$n.json')); o=j.get('total_ops_made') or j.get('average_iops',0)*j.get('total_time_run',0); print(round($d*1e6/max(o,1)))" 2>/dev/null)"
  else
    per="cpu_s_per_gb=$(python3 -c "import json; j=json.load(open('$T/out_$n.json')); b=j.get('bandwidth_mb_sec',0)*j.get('total_time_run',0)/1000; print(round($d/max(b,1e-9),2))" 2>/dev/null)"
  fi
  echo "$L $n load=$l0..$l1 daemon_cpu_s=$d $per client_cpu_s=$(awk '{print $1+$2}' "$T/ct_$n") daemon_hwm_kb=$hwm $(tr -d '\n' <"$T/out_$n.json")"
  if [[ -s $T/perf_$n ]]; then grep -E "task-clock|context-switches|migrations" "$T/perf_$n" | sed "s/^/$L $n perf /"; fi
  if [[ -s $T/err_$n ]]; then sed "s/^/$L $n stderr: /" "$T/err_$n" | tail -3; fi
}
ab_restart_with osd "${CACHE_BYTES:+osd_data_cache_bytes=$CACHE_BYTES}" 4G 3
ab_restart_with global "${CONFIG:-}" 4G 3
# The daemon's idle CPU per second, measured over 5 s.
i0=$(ab_cpu); sleep 5; IDLE_CPU_PER_S=$(echo "($(ab_cpu) - $i0) / 5" | bc -l)
echo "$L idle daemon CPU: $(printf %.3f "$IDLE_CPU_PER_S") s per s"
# bench/compare.sh's order: the 4 MiB seq reads fill the data cache before
# the 4 KiB phases, as they do there.
S0=$S; S=${W4M_SECS:-4}
phase w4m write bytes -b 4194304 -t 16 --no-cleanup --run-name r4m
S=$S0
phase s4m seq bytes -t 16 --run-name r4m
S=${W4K_SECS:-20}
phase w4k write ops -b 4096 -t 64 --no-cleanup --run-name r4k
S=$S0
phase r4k rand ops -t 64 --run-name r4k
grep -E "ERROR|WARN" "$T/dev/daemon.log" | tail -3 | sed "s/^/$L daemon.log: /"
