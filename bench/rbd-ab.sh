#!/usr/bin/env bash
# A/B of `cairn rbd bench` clients on one dev cluster: the block layer's
# client-side changes measured in the same minutes.
#
#   bench/rbd-ab.sh BASE_BIN NEW_BIN [PAIRS]      # PAIRS default 3
#
# Starts a release `cairn dev up` (1 mon + 3 OSDs, pool `rbd` size 3) with
# DAEMON's binary (default BASE_BIN) in a temp dir under BASE_DIR
# (/var/tmp), creates a 1 GiB image (4 MiB objects) and fills it once with
# `rbd bench` 1 MiB writes (so every run writes over existing objects),
# then runs `cairn rbd bench --io-type write` PAIRS times with each client
# binary, alternating (base, new, base, new, ...). Each run prints one
# line: label, MiB/s, the daemon's and the client's CPU seconds per GiB
# written, and the 1-minute load average at its start.
#
# Knobs: IO_SIZE (1M), THREADS (16), TOTAL (1G), PATTERN (seq|rand),
# OSD_SIZE (4G), DAEMON (binary of the cluster), BASE_CONFIG / NEW_CONFIG
# ("key=value ..." central config keys for `client`, set before each run of
# that side: compare cache settings with one binary). Every process it
# starts is stopped by PID and the temp dir is removed on exit.
set -euo pipefail

BASE=${1:?usage: bench/rbd-ab.sh BASE_BIN NEW_BIN [PAIRS]}
NEW=${2:?usage: bench/rbd-ab.sh BASE_BIN NEW_BIN [PAIRS]}
PAIRS=${3:-3}
C=${DAEMON:-$BASE}
IO_SIZE=${IO_SIZE:-1M}
THREADS=${THREADS:-16}
TOTAL=${TOTAL:-1G}
PATTERN=${PATTERN:-seq}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=ab-common.sh
source "$HERE/ab-common.sh"
ab_init rbdab
ab_up "${OSD_SIZE:-4G}" 3
"$C" rbd create bench --size 1G >/dev/null
"$C" rbd bench bench --io-type write --io-size 1M --io-threads 16 --io-total 1G \
  --io-pattern seq >/dev/null

# config_for KVS: removes the `client` keys either side sets, then sets KVS.
config_for() {
  local kv
  for kv in ${BASE_CONFIG:-} ${NEW_CONFIG:-}; do
    "$C" config rm client "${kv%%=*}" >/dev/null 2>&1 || true
  done
  for kv in $1; do
    "$C" config set client "${kv%%=*}" "${kv#*=}" >/dev/null
  done
}

# run LABEL BIN KVS: one bench run, one line.
run() {
  local label=$1 bin=$2 load cpu0 cpu1 out client
  config_for "$3"
  load=$(cut -d' ' -f1 /proc/loadavg)
  cpu0=$(ab_cpu)
  out=$( { /usr/bin/time -f 'CLIENT %U %S' "$bin" rbd bench bench --io-type write \
    --io-size "$IO_SIZE" --io-threads "$THREADS" --io-total "$TOTAL" \
    --io-pattern "$PATTERN"; } 2>&1)
  cpu1=$(ab_cpu)
  client=$(awk '/^CLIENT/ {print $2 + $3}' <<<"$out")
  awk -v label="$label" -v load="$load" -v d="$(echo "$cpu1 - $cpu0" | bc)" -v c="$client" '
    /^elapsed:/ { secs = $2; ops = $4 }
    END {
      if (secs == "") { print label ": no result"; exit 1 }
      # bytes from ops: io-size in bytes comes from the header line
      gib = bytes / 1073741824
      printf "%-6s %8.1f MiB/s  daemon %.2f  client %.2f CPU-s/GiB  load %s\n",
        label, bytes / secs / 1048576, d / gib, c / gib, load
    }
    /^bench / { for (i = 1; i <= NF; i++) if ($i == "io_size") sz = $(i + 1) }
    /^elapsed:/ { bytes = ops * sz }
  ' <<<"$out"
}

for _ in $(seq "$PAIRS"); do
  run base "$BASE" "${BASE_CONFIG:-}"
  run new "$NEW" "${NEW_CONFIG:-}"
done
