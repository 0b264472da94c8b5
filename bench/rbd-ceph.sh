#!/usr/bin/env bash
# Cairn's block images beside Ceph 16's RBD, in one sitting on one machine.
#
#   bench/rbd-ceph.sh [OUT_DIR]            # default: ./rbd-ceph-results
#
# Ceph side: a throwaway single-host Ceph cluster started the way
# ../shared/peers/ceph/run.sh starts its peer (1 mon + 1 mgr + 3 BlueStore
# OSDs on sparse files, everything on 127.0.0.1, cephx, 3 replicas) with a
# pool `rbd` (32 PGs, size 3) and a 1 GiB image, then
#   rbd bench --io-type write|read --io-size 1M  --io-pattern seq  (16 threads)
#   rbd bench --io-type write|read --io-size 4K  --io-pattern rand (32 threads)
#   rbd bench --io-type write --io-size 4K --io-pattern seq (16 threads:
#     the shape of a bare `rbd bench --io-type write`, Ceph's defaults)
#   fio --ioengine=rbd (librbd): 4 KiB randwrite qd32, 1 MiB write/read qd16
# Cairn side: a release `cairn dev up` (1 mon + 3 OSDs, pool `rbd` size 3)
# with a 1 GiB image, then the same five `cairn rbd bench` runs, fio through
# NBD (`cairn rbd serve` + fio's nbd engine) and, as root with /dev/fuse,
# through `cairn rbd map` (fio libaio, direct I/O), and `cairn rados bench`
# 4 KiB writes -t 32 on the same pool. Reads follow the writes that filled
# the image, on both sides.
#
# Each phase records the load average and the CPU seconds the servers
# (Ceph's mon/mgr/OSDs; Cairn's daemon and `rbd serve`) and the client
# spent, so figures can be read as CPU per GB too. OUT_DIR/SUMMARY.md gets
# one table with Cairn / Ceph ratios and the issue's targets.
#
# Knobs: RUNTIME (fio seconds per job, 20), TOTAL_1M (1G), TOTAL_4K (128M),
# THREADS_1M (16), THREADS_4K (32), IMAGE_SIZE (1G), OSD_SIZE_GB (10),
# SKIP_CEPH=1 / SKIP_CAIRN=1 (keep the other side's results from OUT_DIR),
# CEPH_RBD_ARGS (extra arguments for every `rbd bench`, e.g.
# `--rbd_cache=false` to run librbd without its client cache; Pacific's
# `rbd` tool otherwise runs with rbd_cache=true, policy writearound and
# rbd_cache_writethrough_until_flush forced off), CEPH_FIO=0 (skip Ceph's
# fio phases), CAIRN_FIO=0 (skip Cairn's fio/map/rados phases),
# CAIRN (a release `cairn`; built if absent), BASE_DIR (temp dirs, /tmp).
# Every process started here is stopped by PID; temp dirs are removed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
OUT=$(mkdir -p "${1:-$PWD/rbd-ceph-results}" && cd "${1:-$PWD/rbd-ceph-results}" && pwd)
RUNTIME=${RUNTIME:-20}
TOTAL_1M=${TOTAL_1M:-1G}
TOTAL_4K=${TOTAL_4K:-128M}
THREADS_1M=${THREADS_1M:-16}
THREADS_4K=${THREADS_4K:-32}
IMAGE_SIZE=${IMAGE_SIZE:-1G}
OSD_SIZE_GB=${OSD_SIZE_GB:-10}
BASE_DIR=${BASE_DIR:-/tmp}
log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
TICK=$(getconf CLK_TCK)

need() { command -v "$1" >/dev/null || { echo "$1 is not installed ($2)" >&2; exit 1; }; }
need fio "apt-get install fio"
need python3 "apt-get install python3"
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "this fio has no nbd engine" >&2; exit 1; }

# ------------------------------------------------------------ bookkeeping
# Processes we started: "name pid" per line in $PIDS_FILE (stopped at exit,
# newest first, by PID). Temp dirs in TEMPS.
PIDS_FILE=$(mktemp "$BASE_DIR/rbdceph-pids.XXXXXX")
TEMPS=()
CAIRN_DEV=""
MAPPED=""

stop_pid() { # pid
  kill -0 "$1" 2>/dev/null || return 0
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 150); do kill -0 "$1" 2>/dev/null || { wait "$1" 2>/dev/null || true; return 0; }; sleep 0.2; done
  log "pid $1 ignored SIGTERM for 30 s: SIGKILL"
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

stop_all() {
  local lines=() i
  mapfile -t lines <"$PIDS_FILE"
  for ((i = ${#lines[@]} - 1; i >= 0; i--)); do stop_pid "${lines[$i]##* }"; done
  : >"$PIDS_FILE"
}

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  [[ -n $MAPPED ]] && "$CAIRN" rbd unmap "$MAPPED" >/dev/null 2>&1
  stop_all
  [[ -n $CAIRN_DEV ]] && "$CAIRN" dev down --dir "$CAIRN_DEV" >/dev/null 2>&1
  for d in "${TEMPS[@]}"; do rm -rf "$d"; done
  rm -f "$PIDS_FILE"
  ((rc == 0)) || log "failed (rc $rc); partial results in $OUT"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

started() { echo "$1 $2" >>"$PIDS_FILE"; log "started $1 pid $2"; }

# CPU ticks (user+sys) of the given pids, summed.
cpu_ticks() {
  local t=0 p f
  for p in "$@"; do
    [[ -r /proc/$p/stat ]] || continue
    read -r -a f <"/proc/$p/stat"
    # field 2 (comm) has no spaces for our daemons
    t=$((t + f[13] + f[14]))
  done
  echo "$t"
}

# Runs a client command as one phase: records load, wall time, server CPU
# (the pids in SERVER_PIDS) and client CPU (perf-free: /usr/bin/time).
#   phase NAME OUTFILE cmd...
SERVER_PIDS=()
phase() {
  local name=$1 out=$2; shift 2
  local c0 c1 t0 t1 load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  c0=$(cpu_ticks "${SERVER_PIDS[@]}")
  t0=$(date +%s.%N)
  log "$name: $*"
  /usr/bin/time -f 'client_cpu_s %U %S' -o "$out.time" "$@" >"$out" 2>"$out.err" || {
    log "$name failed (see $out.err)"; tail -5 "$out.err" >&2; return 1; }
  t1=$(date +%s.%N)
  c1=$(cpu_ticks "${SERVER_PIDS[@]}")
  echo "$name wall_s=$(echo "$t1 - $t0" | bc) server_cpu_s=$(echo "scale=2; ($c1 - $c0) / $TICK" | bc) \
client_cpu_s=$(awk '{print $2 + $3}' "$out.time") load_before=\"$load\"" >>"$OUT/phases.txt"
}

# ------------------------------------------------------------ Ceph
ceph_side() {
  need ceph-mon "apt-get install ceph (as ../shared/peers/ceph/run.sh does)"
  need rbd "apt-get install ceph-common"
  for p in ceph-mon ceph-osd ceph-mgr; do
    pgrep -x "$p" >/dev/null && log "WARNING: $p processes not started here are running; figures will be distorted"
  done
  local T
  T=$(mktemp -d "$BASE_DIR/rbdceph-ceph.XXXXXX"); TEMPS+=("$T")
  export CEPH_CONF=$T/ceph.conf
  local fsid p1 p2
  fsid=$(cat /proc/sys/kernel/random/uuid)
  read -r p1 p2 < <(python3 -c '
import socket
a = socket.socket(); a.bind(("127.0.0.1", 0)); b = socket.socket(); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])')
  mkdir -p "$T"/{run,log,mon/ceph-a,mgr/ceph-x,osd}
  # The peer script's cluster settings: loopback only, cephx, 3 replicas
  # on one host (failure domain osd), autoscaler off, BlueStore on files.
  cat >"$CEPH_CONF" <<EOF
[global]
fsid = $fsid
mon_initial_members = a
mon_host = [v2:127.0.0.1:$p2,v1:127.0.0.1:$p1]
public_network = 127.0.0.0/8
cluster_network = 127.0.0.0/8
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_ipv4 = true
ms_bind_ipv6 = false
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
auth_allow_insecure_global_id_reclaim = false
run_dir = $T/run
log_file = $T/log/\$cluster-\$name.log
crash_dir = $T/run
osd_pool_default_size = 3
osd_pool_default_min_size = 2
osd_crush_chooseleaf_type = 0
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_delete = true
mgr_initial_modules = iostat
[mon]
mon_data = $T/mon/\$cluster-\$id
[mgr]
mgr_data = $T/mgr/\$cluster-\$id
keyring = $T/mgr/\$cluster-\$id/keyring
[osd]
osd_data = $T/osd/\$cluster-\$id
keyring = $T/osd/\$cluster-\$id/keyring
osd_objectstore = bluestore
bluestore_block_path = $T/osd/\$cluster-\$id/block.file
bluestore_block_create = true
bluestore_block_size = $((OSD_SIZE_GB << 30))
[client]
keyring = $T/admin.keyring
EOF
  ceph-authtool --create-keyring "$T/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$T/admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$T/mon.keyring" --import-keyring "$T/admin.keyring" >/dev/null
  monmaptool --create --fsid "$fsid" --enable-all-features \
    --addv a "[v2:127.0.0.1:$p2,v1:127.0.0.1:$p1]" "$T/monmap" >/dev/null
  ceph-mon --mkfs -i a --monmap "$T/monmap" --keyring "$T/mon.keyring"
  ceph-mon -i a -f </dev/null >>"$T/log/mon.out" 2>&1 & started mon.a $!
  wait_until 60 "the mon" timeout 10 ceph mon stat
  ceph auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
    -o "$T/mgr/ceph-x/keyring"
  ceph-mgr -i x -f </dev/null >>"$T/log/mgr.out" 2>&1 & started mgr.x $!
  local i id uuid key
  for i in 0 1 2; do
    uuid=$(cat /proc/sys/kernel/random/uuid)
    key=$(ceph-authtool --gen-print-key)
    printf '{"cephx_secret": "%s"}' "$key" >"$T/secret.json"
    id=$(ceph osd new "$uuid" -i "$T/secret.json"); rm -f "$T/secret.json"
    mkdir -p "$T/osd/ceph-$id"
    ceph-osd -i "$id" --mkfs --key "$key" --osd-uuid "$uuid" >>"$T/log/osd-mkfs.out" 2>&1
    ceph-authtool "$T/osd/ceph-$id/keyring" --create-keyring --name "osd.$id" --add-key "$key" >/dev/null
    ceph-osd -i "$id" -f </dev/null >>"$T/log/osd.$id.out" 2>&1 & started "osd.$id" $!
  done
  wait_until 180 "3 OSDs up" ceph_osds_up
  ceph osd pool create rbd 32 32 replicated >/dev/null
  ceph osd pool set rbd size 3 >/dev/null
  rbd pool init rbd
  wait_until 180 "PGs active+clean" ceph_clean
  rbd create rbd/bench --size "$IMAGE_SIZE"
  rbd info rbd/bench >"$OUT/ceph/rbd_info.txt"
  dpkg-query -W -f='${Version}\n' ceph-osd >"$OUT/ceph/version.txt"
  mapfile -t SERVER_PIDS < <(awk '{print $2}' "$PIDS_FILE")

  ceph_bench write 1M "$THREADS_1M" "$TOTAL_1M" seq
  ceph_bench read 1M "$THREADS_1M" "$TOTAL_1M" seq
  ceph_bench write 4K "$THREADS_4K" "$TOTAL_4K" rand
  ceph_bench read 4K "$THREADS_4K" "$TOTAL_4K" rand
  ceph_bench write 4K 16 "$TOTAL_4K" seq seq
  local fio_rbd=(--ioengine=rbd --clientname=admin --pool=rbd --rbdname=bench)
  if [[ ${CEPH_FIO:-1} == 1 ]]; then
    fio_phase ceph_fio_randwrite_4k "${fio_rbd[@]}" --rw=randwrite --bs=4k --iodepth="$THREADS_4K"
    fio_phase ceph_fio_write_1m "${fio_rbd[@]}" --rw=write --bs=1M --iodepth="$THREADS_1M"
    fio_phase ceph_fio_read_1m "${fio_rbd[@]}" --rw=read --bs=1M --iodepth="$THREADS_1M"
  fi
  ceph -s >"$OUT/ceph/ceph_s.txt" 2>&1 || true
  stop_all
  SERVER_PIDS=()
  unset CEPH_CONF
}

wait_until() { # seconds what cmd...
  local limit=$1 what=$2; shift 2
  local t0=$SECONDS
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - t0 < limit)) || { log "timed out after ${limit}s waiting for $what"; return 1; }
    sleep 1
  done
}
ceph_osds_up() { timeout 30 ceph osd stat -f json | python3 -c 'import json,sys; sys.exit(json.load(sys.stdin)["num_up_osds"] != 3)'; }
ceph_clean() {
  timeout 30 ceph pg stat -f json | python3 -c '
import json, sys
j = json.load(sys.stdin)
s = j.get("pg_summary", j).get("num_pg_by_state", [])
n = sum(x["num"] for x in s)
ok = sum(x["num"] for x in s if x["name"] == "active+clean")
sys.exit(not (n > 0 and n == ok))'
}

ceph_bench() { # type size threads total pattern [name suffix]
  phase "ceph_rbd_bench_$1_$2${6:-}" "$OUT/ceph/rbd_bench_$1_$2${6:-}.txt" \
    rbd bench --io-type "$1" --io-size "$2" --io-threads "$3" --io-total "$4" --io-pattern "$5" \
    ${CEPH_RBD_ARGS:-} rbd/bench
}

fio_phase() { # name fio-args... (over the first IMAGE_SIZE, RUNTIME seconds)
  local name=$1; shift
  phase "$name" "$OUT/$name.json" fio --name="$name" "$@" --size="$IMAGE_SIZE" \
    --time_based --runtime="$RUNTIME" --output-format=json
}

# ------------------------------------------------------------ Cairn
cairn_side() {
  if [[ -z ${CAIRN:-} ]]; then
    log "building release cairn"
    (cd "$ROOT" && cargo build --release --bin cairn -q)
    CAIRN=${CARGO_TARGET_DIR:-$ROOT/target}/release/cairn
  fi
  local T
  T=$(mktemp -d "$BASE_DIR/rbdceph-cairn.XXXXXX"); TEMPS+=("$T")
  CAIRN_DEV=$T/dev
  "$CAIRN" dev up --dir "$CAIRN_DEV" --osd-size "$((OSD_SIZE_GB))G" --detach >"$OUT/cairn/dev_up.txt" 2>&1
  export CAIRN_CONF=$CAIRN_DEV/cairn.conf
  local daemon
  daemon=$(cat "$CAIRN_DEV/cairn.pid")
  SERVER_PIDS=("$daemon")
  "$CAIRN" rbd create bench --size "$IMAGE_SIZE"
  git -C "$ROOT" rev-parse --short HEAD >"$OUT/cairn/version.txt" 2>/dev/null || true

  cairn_bench write 1M "$THREADS_1M" "$TOTAL_1M" seq
  cairn_bench read 1M "$THREADS_1M" "$TOTAL_1M" seq
  cairn_bench write 4K "$THREADS_4K" "$TOTAL_4K" rand
  cairn_bench read 4K "$THREADS_4K" "$TOTAL_4K" rand
  cairn_bench write 4K 16 "$TOTAL_4K" seq seq
  if [[ ${CAIRN_FIO:-1} != 1 ]]; then
    "$CAIRN" dev down --dir "$CAIRN_DEV" >/dev/null 2>&1 || true
    CAIRN_DEV=""
    unset CAIRN_CONF
    return 0
  fi

  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$CAIRN" rbd serve bench --listen "127.0.0.1:$port" >"$T/serve.out" 2>"$T/serve.err" &
  local serve=$!
  started "rbd serve" "$serve"
  wait_until 30 "rbd serve" grep -q serving "$T/serve.out" || { cat "$T/serve.err" >&2; return 1; }
  SERVER_PIDS=("$daemon" "$serve")
  local nbd=(--ioengine=nbd --uri="nbd://127.0.0.1:$port/bench")
  fio_phase cairn_fio_nbd_randwrite_4k "${nbd[@]}" --rw=randwrite --bs=4k --iodepth="$THREADS_4K"
  fio_phase cairn_fio_nbd_write_1m "${nbd[@]}" --rw=write --bs=1M --iodepth="$THREADS_1M"
  fio_phase cairn_fio_nbd_read_1m "${nbd[@]}" --rw=read --bs=1M --iodepth="$THREADS_1M"
  stop_pid "$serve"
  sed -i "/ $serve\$/d" "$PIDS_FILE"
  SERVER_PIDS=("$daemon")

  if [[ $(id -u) == 0 && -e /dev/fuse ]] && command -v losetup >/dev/null; then
    export CAIRN_RBD_MAP_DIR=$T/map
    MAPPED=$("$CAIRN" rbd map bench) || { log "rbd map failed: skipping the map phases"; MAPPED=""; }
  fi
  if [[ -n $MAPPED ]]; then
    local helper
    helper=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["helper_pid"])' \
      "$CAIRN_RBD_MAP_DIR/rbd@bench.json" 2>/dev/null || true)
    [[ -n $helper ]] && SERVER_PIDS=("$daemon" "$helper")
    local dev=(--filename="$MAPPED" --ioengine=libaio --direct=1)
    fio_phase cairn_fio_map_randwrite_4k "${dev[@]}" --rw=randwrite --bs=4k --iodepth="$THREADS_4K"
    fio_phase cairn_fio_map_write_1m "${dev[@]}" --rw=write --bs=1M --iodepth="$THREADS_1M"
    fio_phase cairn_fio_map_read_1m "${dev[@]}" --rw=read --bs=1M --iodepth="$THREADS_1M"
    "$CAIRN" rbd unmap "$MAPPED"; MAPPED=""
    SERVER_PIDS=("$daemon")
  else
    log "no rbd map phases (not root, no /dev/fuse or losetup, or map failed)"
  fi
  phase cairn_rados_bench_write_4k "$OUT/cairn/rados_bench_write_4k.txt" \
    "$CAIRN" rados -p rbd bench "$RUNTIME" write -b 4096 -t "$THREADS_4K"
  "$CAIRN" dev down --dir "$CAIRN_DEV" >/dev/null 2>&1 || true
  CAIRN_DEV=""
  unset CAIRN_CONF
}

cairn_bench() { # type size threads total pattern [name suffix]
  phase "cairn_rbd_bench_$1_$2${6:-}" "$OUT/cairn/rbd_bench_$1_$2${6:-}.txt" \
    "$CAIRN" rbd bench bench --io-type "$1" --io-size "$2" --io-threads "$3" --io-total "$4" --io-pattern "$5"
}

# ------------------------------------------------------------ main
mkdir -p "$OUT/ceph" "$OUT/cairn"
{ echo "date=$(date -Is)"; echo "nproc=$(nproc)"; echo "loadavg_start=$(cat /proc/loadavg)"
  echo "runtime=$RUNTIME total_1m=$TOTAL_1M total_4k=$TOTAL_4K threads_1m=$THREADS_1M threads_4k=$THREADS_4K image=$IMAGE_SIZE"
} >"$OUT/machine.txt"
[[ ${SKIP_CEPH:-0} == 1 || ${SKIP_CAIRN:-0} == 1 ]] || : >"$OUT/phases.txt"
touch "$OUT/phases.txt"
if [[ ${SKIP_CEPH:-0} != 1 ]]; then
  sed -i '/^ceph_/d' "$OUT/phases.txt"
  ceph_side
fi
if [[ ${SKIP_CAIRN:-0} != 1 ]]; then
  sed -i '/^cairn_/d' "$OUT/phases.txt"
  cairn_side
fi
echo "loadavg_end=$(cat /proc/loadavg)" >>"$OUT/machine.txt"
python3 "$HERE/rbd_ceph_report.py" "$OUT" | tee "$OUT/SUMMARY.md"
