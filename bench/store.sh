#!/usr/bin/env bash
# Runs `cairn store bench` beside fio on the same filesystem, with the same
# concurrency and the same durability (every fio write is followed by
# fdatasync; fio uses O_DIRECT where the filesystem allows), and prints both
# and the ratio. Usage:
#   bench/store.sh [DIR] [SECONDS]
# Env: CAIRN=path/to/cairn (default: target/release/cairn), CACHE=128M,
#      RUNS=N (repeat every workload N times, default 1; with N > 1 a summary
#      prints each workload's ratios: min / median / max),
#      STORE_BENCH=path/to/store_bench (the store crate's example, quicker to
#      build than the CLI: `cargo build --release -p cairn-store --example
#      store_bench`; same benchmark code, cache fixed at 128 MiB),
#      WRITES_ONLY=1 (skip the read workloads),
#      DRIVERS=N (threads that submit the store's writes, default: the CPU
#      count, as an OSD's workers; 0: one blocking thread per write in flight).
# Fairness: both sides keep the same number of I/Os outstanding (fio psync,
# numjobs = threads, one each; the store bench: as many commits in flight,
# submitted by DRIVERS threads as the OSD submits them, or reads from as
# many threads), and an I/O counts only once durable (fio: O_DIRECT
# write + fdatasync; the store: commit returned). fio writes in place into
# files it laid out before timing (so its fdatasync is a cache flush only);
# the store also makes its metadata durable (the WAL record). The store
# bench prefills its 1 GiB working set before timing, as fio lays out its
# files. The store runs first, fio right after, in the same minute.
# CPU us/op: the process's user+system CPU time over the timed run per
# operation (the store: getrusage; fio: usr_cpu+sys_cpu over its summed job
# runtime) — steadier than throughput on a machine others load.
set -euo pipefail
DIR=${1:-/var/tmp/cairn-store-bench}
SECS=${2:-10}
CAIRN=${CAIRN:-$(dirname "$0")/../target/release/cairn}
CACHE=${CACHE:-128M}
RUNS=${RUNS:-1}
DRIVERS=${DRIVERS:-$(nproc)}
command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)" >&2; exit 1; }
STORE_BENCH=${STORE_BENCH:-}
if [[ -n $STORE_BENCH ]]; then
  [[ -x $STORE_BENCH ]] || { echo "no store_bench binary at $STORE_BENCH" >&2; exit 1; }
else
  [[ -x $CAIRN ]] || { echo "no cairn binary at $CAIRN (cargo build --release -p cairn-cli, or set CAIRN= or STORE_BENCH=)" >&2; exit 1; }
fi
mkdir -p "$DIR"
DIRECT=1
if ! dd if=/dev/zero of="$DIR/.odirect" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
  DIRECT=0; echo "note: $DIR does not support O_DIRECT; fio runs buffered"
fi
rm -f "$DIR/.odirect"

# fio_run NAME RW BS JOBS -> prints "MBps IOPS p50us p99us maxus cpu_us_per_op"
fio_run() {
  local name=$1 rw=$2 bs=$3 jobs=$4 size=$5
  local extra=()
  [[ $rw == *write* ]] && extra+=(--fdatasync=1)
  fio --name="$name" --directory="$DIR/fio" --rw="$rw" --bs="$bs" --numjobs="$jobs" --size="$size" \
      --ioengine=psync --direct=$DIRECT --time_based --runtime="$SECS" --group_reporting \
      --output-format=json "${extra[@]}" 2>/dev/null |
  python3 -c '
import json,sys
j=json.load(sys.stdin)["jobs"][0]
op=j["write"] if j["write"]["io_bytes"]>0 else j["read"]
lat=op.get("clat_ns",{}); pct=lat.get("percentile",{})
# with fdatasync the sync time is separate; report clat+sync as the op latency
sync=j.get("sync",{}).get("lat_ns",{})
def p(k): return (pct.get(k,0)+sync.get("percentile",{}).get(k,0))/1000
# CPU: usr/sys are percentages of the summed job runtime (ms)
cpu=(j["usr_cpu"]+j["sys_cpu"])/100*j.get("job_runtime",0)/1000
print("%.1f %.0f %.0f %.0f %.0f %.1f"%(op["bw_bytes"]/1e6, op["iops"], p("50.000000"), p("99.000000"), (lat.get("max",0)+sync.get("max",0))/1000, cpu*1e6/max(op["total_ios"],1)))'
}

# cairn_run ARGS... -> prints "MBps IOPS p50us p99us maxus rssMiB cpu_us_per_op"
cairn_run() {
  if [[ -n $STORE_BENCH ]]; then
    local size threads read=
    while [[ $# -gt 0 ]]; do
      case $1 in
        --size) size=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --read) read=read; shift ;;
        *) shift ;;
      esac
    done
    case $size in 4M) size=$((4 << 20)) ;; 4K) size=4096 ;; esac
    DRIVERS=$DRIVERS "$STORE_BENCH" "$DIR/store" "$size" "$threads" "$SECS" $read
  else
    "$CAIRN" -f json store bench --path "$DIR/store" --seconds "$SECS" --cache-bytes "$CACHE" \
      --drivers "$DRIVERS" "$@"
  fi |
  python3 -c '
import json,sys
r=json.load(sys.stdin)
print("%.1f %.0f %d %d %d %d %.1f"%(r["mb_per_s"],r["iops"],r["lat_p50_us"],r["lat_p99_us"],r["lat_max_us"],r["rss_peak_bytes"]>>20,r.get("cpu_us_per_op",0)))'
}

declare -A RATIOS
row() { # row LABEL "cairn" "fio"
  read -r cm ci cp50 cp99 cmax crss ccpu <<<"$2"
  read -r fm fi fp50 fp99 fmax fcpu <<<"$3"
  RATIOS[$1]+="$(python3 -c "print('%.3f' % ($cm / max($fm, 1e-9)))") "
  printf "%-22s cairn %8.1f MB/s %7.0f IOPS p50 %7d us p99 %7d us max %7d us RSS %4d MiB CPU %6.1f us/op\n" "$1" "$cm" "$ci" "$cp50" "$cp99" "$cmax" "$crss" "$ccpu"
  printf "%-22s fio   %8.1f MB/s %7.0f IOPS p50 %7.0f us p99 %7.0f us max %7.0f us              CPU %6.1f us/op\n" "" "$fm" "$fi" "$fp50" "$fp99" "$fmax" "$fcpu"
  python3 -c "print('%-22s ratio %.2f x fio' % ('', $cm / max($fm, 1e-9)))"
}

echo "store bench in $DIR, ${SECS}s per run, ${RUNS} run(s), O_DIRECT for fio: $DIRECT, store_cache_bytes $CACHE, write drivers $DRIVERS"
echo "load: $(uptime)"
for run in $(seq 1 "$RUNS"); do
  [[ $RUNS -gt 1 ]] && echo "--- run $run of $RUNS (load:$(uptime | sed 's/.*load average//'))"
  rm -rf "$DIR/store" "$DIR/fio"; mkdir -p "$DIR/fio"
  c=$(cairn_run --size 4M --threads 16); f=$(fio_run w4m write 4M 16 64M)
  row "4M write, 16 threads" "$c" "$f"
  rm -rf "$DIR/store" "$DIR/fio"; mkdir -p "$DIR/fio"
  c=$(cairn_run --size 4K --threads 64); f=$(fio_run w4k randwrite 4K 64 16M)
  row "4K write, 64 threads" "$c" "$f"
  [[ -n ${WRITES_ONLY:-} ]] && continue
  rm -rf "$DIR/store" "$DIR/fio"; mkdir -p "$DIR/fio"
  c=$(cairn_run --size 4M --threads 16 --read); f=$(fio_run r4m randread 4M 16 64M)
  row "4M read, 16 threads" "$c" "$f"
  c=$(cairn_run --size 4K --threads 64 --read); f=$(fio_run r4k randread 4K 64 16M)
  row "4K read, 64 threads" "$c" "$f"
done
rm -rf "$DIR/store" "$DIR/fio"
if [[ $RUNS -gt 1 ]]; then
  echo "--- ratios over $RUNS runs (cairn / fio): min / median / max"
  for k in "${!RATIOS[@]}"; do
    python3 -c "
import statistics,sys
v=sorted(float(x) for x in sys.argv[2].split())
print('%-22s %.2f / %.2f / %.2f   (%s)' % (sys.argv[1], v[0], statistics.median(v), v[-1], ' '.join('%.2f'%x for x in v)))" "$k" "${RATIOS[$k]}"
  done
fi
