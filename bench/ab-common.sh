# bench/ab-common.sh: the set-up the A/B scripts (ab-seq.sh, ab-read.sh,
# ab-write.sh) share; sourced, not run. It owns the temp dir, the fresh
# release dev cluster in it (restarts with central config changes
# included), the daemon's CPU seconds, and the clean-up on exit: it stops
# what it started (by PID) and removes the temp dir.
#
# The caller sets C (the cairn binary) before sourcing. Env: BASE_DIR
# (where the temp dir goes, /var/tmp), NICE (niceness of the daemon, 0),
# CONFIG ("key=value ..." central config keys set for `global` before the
# phases, then the cluster restarts; a list value takes commas:
# CONFIG="ms_client_mode=secure ms_cluster_mode=crc,secure").

# ab_init NAME: the temp dir $T (NAME.XXXXXX) and the exit trap.
ab_init() {
  T=$(mktemp -d "${BASE_DIR:-/var/tmp}/$1.XXXXXX")
  PID=""
  trap ab_cleanup EXIT
}

ab_cleanup() {
  "$C" dev down --dir "$T/dev" >/dev/null 2>&1 || true
  sleep 1
  if [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null; then kill "$PID"; fi
  rm -rf "$T"
}

# ab_up OSD_SIZE SETTLE_SECS: starts (or restarts) the dev cluster in $T/dev,
# sets PID (the node daemon) and CAIRN_CONF, then waits SETTLE_SECS.
ab_up() {
  nice -n "${NICE:-0}" "$C" dev up --dir "$T/dev" --detach --osd-size "$1" >"$T/up.txt" 2>&1 ||
    { cat "$T/up.txt"; exit 1; }
  PID=$(cat "$T/dev/cairn.pid")
  export CAIRN_CONF=$T/dev/cairn.conf
  sleep "$2"
}

# ab_restart_with SECTION "key=value ..." OSD_SIZE SETTLE_SECS: sets the keys
# for SECTION in the central config and restarts the cluster (the daemon
# reads them at start). Nothing to do for an empty list.
ab_restart_with() {
  local section=$1 kvs=$2 kv
  [[ -z $kvs ]] && return 0
  for kv in $kvs; do
    "$C" config set "$section" "${kv%%=*}" "${kv#*=}" >/dev/null || exit 1
  done
  "$C" dev down --dir "$T/dev" >/dev/null 2>&1
  for _ in $(seq 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.2; done
  ab_up "$3" "$4"
}

# The node daemon's CPU seconds so far (user + system).
ab_cpu() { awk '{print ($14+$15)/100}' "/proc/$PID/stat"; }
