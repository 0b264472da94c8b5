#!/usr/bin/env bash
# Recovery figures (issue 6), release builds, each beside fio's sequential
# write bandwidth on the same filesystem in the same run (4 MiB, O_DIRECT,
# iodepth 8, 1 GiB, final fsync):
#
# 1. `dev` (the default's first part): a dev cluster (`cairn dev up`, one
#    mon and RECOVERY_OSDS=4 OSDs on RECOVERY_OSD_SIZE=2G files under
#    RECOVERY_DIR=/var/tmp/recovery), throttles lifted
#    (`osd_max_backfills` and `osd_recovery_max_active` 64,
#    `osd_recovery_sleep` 0, no bandwidth cap). RECOVERY_MB=1200 MiB of
#    random data is written as 4 MiB objects of an rbd image in the
#    size-3 pool `rbd` (and, with RECOVERY_EC=1, as 4 MiB objects in the
#    2+1 pool `ec21`), then the last OSD is marked out. It prints the time
#    from the out to every PG active and to every PG active+clean with no
#    pg_temp left, the bytes the OSDs copied (their `recovery copy:` log
#    lines: first copy sent to last copy durable, all OSDs together), as
#    MB/s and as a ratio of fio's bandwidth, and the daemon's CPU seconds
#    per GB moved, and fio's copy rate on the same disk (4 MiB reads and
#    writes mixed 50/50: the ceiling for a copy whose source and target
#    share one disk). RECOVERY_PERF=record also records the daemon from the
#    out to clean (`perf record --call-graph dwarf`), RECOVERY_PERF=trace
#    sums its system calls (`perf trace -s`); either writes
#    RECOVERY_DIR/perf.txt (RECOVERY_PERF_KEEP=1 keeps perf.data).
# 2. `backfill`: background backfill alone, the ignored test
#    `backfill_throughput` of crates/osd/tests/backfill.rs (4 in-process
#    OSDs on real stores and loopback sockets, 1 MiB objects, throttles
#    lifted; an OSD marked out, the PGs backfilled through pg_temp).
#    Prints the copy phase, the time from out to active+clean and CPU-s/GB.
# 3. `faults` (the default's second part): the ignored test
#    `recovery_figures` of crates/cli/tests/faults.rs: three host daemons x
#    two OSDs on 127.0.x.y (heartbeat grace 3 s): the time from kill -9 of
#    a host to every PG active again (three runs), log-based recovery
#    after an outage during which 4 MiB objects were written, and the copy
#    after an OSD is lost and marked out; each end to end and as its copy
#    phase, as MB/s and as a ratio of fio's bandwidth.
# 4. `mac`: how fast one core computes the frame MAC (keyed BLAKE3) over
#    1 MiB payloads in different segment layouts, beside a memcpy
#    (crates/msg/examples/mac_speed.rs; not part of the default run).
#
# Usage: bench/recovery.sh [dev|backfill|faults|mac]   (default: dev, then faults;
# needs fio; dev needs RECOVERY_OSDS x RECOVERY_OSD_SIZE + 1 GiB free and
# removes everything it created; faults needs ~12 GB free under TMPDIR)
# Env: CARGO_TARGET_DIR as usual; CAIRN_BIN (dev: this cairn binary instead of
# building one, for A/B runs); CAIRN_BACKFILL_OBJECTS (default 256).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)" >&2; exit 1; }
what="${1:-all}"
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "load: $(load)"

# fio's sequential write bandwidth in directory $1, bytes/s.
fio_write_bw() {
  local f="$1/fio-recovery.dat"
  fio --name=raw-write --rw=write --bs=4M --size=1G --direct=1 --ioengine=libaio \
    --iodepth=8 --end_fsync=1 --output-format=json --filename="$f" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"])'
  rm -f "$f"
}

# fio's copy rate on one disk, bytes/s each way: 4 MiB O_DIRECT reads and
# writes mixed 50/50 (iodepth 8, 1 GiB, final fsync) — what a copy whose
# source and target share the disk can reach, as in a one-machine cluster.
fio_copy_bw() {
  local f="$1/fio-recovery-copy.dat"
  fio --name=raw-copy --rw=rw --rwmixread=50 --bs=4M --size=1G --direct=1 --ioengine=libaio \
    --iodepth=8 --end_fsync=1 --output-format=json --filename="$f" |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(min(j["read"]["bw_bytes"], j["write"]["bw_bytes"]))'
  rm -f "$f"
}

# CPU seconds (user + system) used so far by process $1.
cpu_secs() {
  awk '{ print ($14 + $15) / 100 }' "/proc/$1/stat" 2>/dev/null || echo 0
}

dev_run() {
  local base="${RECOVERY_DIR:-/var/tmp/recovery}" osds="${RECOVERY_OSDS:-4}"
  local size="${RECOVERY_OSD_SIZE:-2G}" mb="${RECOVERY_MB:-1200}"
  local dir="$base/dev" target="${CARGO_TARGET_DIR:-target}"
  local cairn="${CAIRN_BIN:-}"
  if [ -z "$cairn" ]; then
    cargo build --release --bin cairn
    cairn="$target/release/cairn"
  fi
  [ -x "$cairn" ] || { echo "no $cairn after the build" >&2; exit 1; }
  mkdir -p "$base"
  [ -e "$dir" ] && { echo "$dir exists: remove it (or 'cairn dev down --dir $dir') first" >&2; exit 1; }
  export CAIRN_CONF="$dir/cairn.conf"
  # shellcheck disable=SC2064 # expanded now: the locals are gone at exit
  trap "'$cairn' dev down --dir '$dir' >/dev/null 2>&1 || true; rm -rf '$dir'" EXIT
  "$cairn" dev up --dir "$dir" --osds "$osds" --osd-size "$size" --detach >/dev/null
  for kv in "osd_max_backfills 64" "osd_recovery_max_active 64" "osd_recovery_sleep 0" \
    "osd_recovery_max_bytes_per_sec 0"; do
    # shellcheck disable=SC2086
    "$cairn" config set osd $kv >/dev/null
  done
  echo "writing $mb MiB of 4 MiB objects (size 3) ..."
  head -c "${mb}M" /dev/urandom | "$cairn" rbd import - rbd/recovery --size "${mb}M" >/dev/null 2>&1
  if [ "${RECOVERY_EC:-0}" = 1 ]; then
    echo "writing 4 MiB objects to ec21 for 10 s ..."
    "$cairn" rados -p ec21 bench 10 write -b 4194304 -t 8 --no-cleanup >/dev/null
  fi
  wait_clean "$cairn" 300 || { echo "not active+clean after writing" >&2; exit 1; }
  local raw copy
  raw=$(fio_write_bw "$base")
  echo "fio (4 MiB direct writes, iodepth 8, 1 GiB, $base): $(awk -v b="$raw" 'BEGIN { printf "%.1f", b / 1e6 }') MB/s; load $(load)"
  copy=$(fio_copy_bw "$base")
  echo "fio copy on this disk (4 MiB direct reads + writes 50/50, iodepth 8): $(awk -v b="$copy" 'BEGIN { printf "%.1f", b / 1e6 }') MB/s each way; load $(load)"
  local victim=$((osds - 1)) pid
  pid=$(cat "$dir/cairn.pid")
  local log="$dir/daemon.log" lines cpu0 t0 t_active="" t_clean=""
  lines=$(wc -l <"$log")
  cpu0=$(cpu_secs "$pid")
  local perf_pid=""
  case "${RECOVERY_PERF:-0}" in
    record)
      perf record -F 499 --call-graph dwarf,16384 -p "$pid" -o "$base/perf.data" >/dev/null 2>&1 &
      perf_pid=$! ;;
    trace)
      perf trace -s -p "$pid" -o "$base/perf.txt" >/dev/null 2>&1 &
      perf_pid=$! ;;
  esac
  [ -n "$perf_pid" ] && sleep 1
  t0=$(date +%s.%N)
  "$cairn" osd out "$victim" >/dev/null
  # The PG states come from the OSDs' beacons: the states from before the
  # out still read clean, so the end is a clean state seen after a
  # non-clean one (or after the first copy was logged).
  local deadline=$(($(date +%s) + 600)) moved=0 st
  while [ "$(date +%s)" -lt "$deadline" ]; do
    st=$("$cairn" -f json pg stat 2>/dev/null || echo '{}')
    if [ "$moved" = 0 ]; then
      if ! echo "$st" | all_pgs clean || tail -n +"$((lines + 1))" "$log" | grep -q 'recovery copy:'; then
        moved=1
      fi
    fi
    if [ "$moved" = 1 ] && [ -z "$t_active" ] && echo "$st" | all_pgs active; then
      t_active=$(date +%s.%N)
    fi
    if [ "$moved" = 1 ] && echo "$st" | all_pgs clean; then
      t_clean=$(date +%s.%N)
      break
    fi
    sleep 0.1
  done
  [ -n "$t_clean" ] || { echo "not active+clean 600 s after the out" >&2; exit 1; }
  local cpu1
  cpu1=$(cpu_secs "$pid")
  if [ -n "$perf_pid" ]; then
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
    if [ -f "$base/perf.data" ]; then
      perf report -i "$base/perf.data" --no-children --percent-limit 0.7 --stdio \
        >"$base/perf.txt" 2>/dev/null || true
      [ "${RECOVERY_PERF_KEEP:-0}" = 1 ] || rm -f "$base/perf.data"
    fi
    echo "perf ${RECOVERY_PERF} of the daemon during the recovery: $base/perf.txt"
  fi
  sleep 2.5 # the meter logs an episode once nothing was in flight for 1 s
  tail -n +"$((lines + 1))" "$log" | grep 'recovery copy:' |
    python3 -c '
import re, sys
t0, ta, tc, raw, cpu, copy = (float(x) for x in sys.argv[1:7])
first, last, total, objs = None, None, 0, 0
for line in sys.stdin:
    m = re.search(r"moved (\d+) bytes \((\d+) objects\) in [0-9.]+ s, from (\d+) to (\d+) ms", line)
    if not m:
        continue
    b, n, s, e = (int(x) for x in m.groups())
    total += b; objs += n
    first = s if first is None else min(first, s)
    last = e if last is None else max(last, e)
if not total:
    sys.exit("no recovery copy was logged")
secs = (last - first) / 1000.0
print(f"out -> every PG active {ta - t0:.2f} s; -> active+clean, no pg_temp {tc - t0:.2f} s")
print(f"copied {total / 1e6:.1f} MB ({objs} objects) in {secs:.2f} s from the first copy sent to the last durable "
      f"= {total / 1e6 / secs:.1f} MB/s = {total / secs / raw:.2f}x fio "
      f"({total / secs / copy:.2f}x the fio copy rate on this disk)")
print(f"out -> clean: {total / 1e6 / (tc - t0):.1f} MB/s = {total / (tc - t0) / raw:.2f}x fio")
print(f"daemon CPU, out -> clean: {cpu:.2f} s = {cpu / (total / 1e9):.2f} CPU-s per GB moved")
' "$t0" "$t_active" "$t_clean" "$raw" "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { print b - a }')" "$copy"
  echo "load: $(load)"
}

# Reads `pg stat -f json` on stdin: true when every PG's state has $1.
all_pgs() {
  python3 -c '
import json, sys
v = json.load(sys.stdin); want = sys.argv[1]
n = v.get("num_pgs", 0)
ok = sum(c for s, c in v.get("by_state", {}).items()
         if want in s.split("+") and "stale" not in s
         and (want != "clean" or not ({"remapped", "degraded", "backfilling", "backfill_wait", "recovering"} & set(s.split("+")))))
sys.exit(0 if n > 0 and ok == n else 1)' "$1"
}

wait_clean() {
  local deadline=$(($(date +%s) + $2))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    "$1" -f json pg stat 2>/dev/null | all_pgs clean && return 0
    sleep 0.5
  done
  return 1
}

if [ "$what" = all ] || [ "$what" = dev ]; then
  (dev_run)
fi
if [ "$what" = backfill ]; then
  cargo test --release -p cairn-osd --test backfill backfill_throughput -- --ignored --nocapture --test-threads=1
fi
if [ "$what" = all ] || [ "$what" = faults ]; then
  cargo test --release -p cairn-cli --test faults recovery_figures -- --ignored --nocapture --test-threads=1
fi
if [ "$what" = mac ]; then
  cargo run --release -p cairn-msg --example mac_speed
fi
echo "load: $(load)"
