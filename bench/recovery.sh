#!/usr/bin/env bash
# Recovery figures (issue 6), release builds, each beside fio's sequential
# write bandwidth on the same filesystem in the same run (4 MiB, O_DIRECT,
# iodepth 8, 1 GiB, final fsync):
#
# 1. background backfill alone: the ignored test `backfill_throughput` of
#    crates/osd/tests/backfill.rs (4 in-process OSDs on real stores and
#    loopback sockets, 1 MiB objects, throttles lifted; an OSD marked out,
#    the PGs backfilled through pg_temp). Prints the copy phase (first
#    batch sent to last batch durable, from the OSDs' copy meters) and the
#    time from out to active+clean.
# 2. the ignored test `recovery_figures` of crates/cli/tests/faults.rs:
#    three host daemons x two OSDs on 127.0.x.y (heartbeat grace 3 s):
#    the time from kill -9 of a host to every PG active again (three
#    runs), log-based recovery after an outage during which 4 MiB objects
#    were written, and the copy after an OSD is lost and marked out; each
#    end to end and as its copy phase (read from the daemons' `recovery
#    copy:` log lines), as MB/s and as a ratio of fio's bandwidth.
#
# 3. `mac`: how fast one core computes the frame MAC (keyed BLAKE3) over
#    1 MiB payloads in different segment layouts, beside a memcpy
#    (crates/msg/examples/mac_speed.rs; not part of the default run).
#
# Usage: bench/recovery.sh [backfill|faults|mac]   (default: the first two; TMPDIR
# selects the disk; needs fio and ~12 GB free)
# Env: CARGO_TARGET_DIR as usual; CAIRN_BACKFILL_OBJECTS (default 256).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)" >&2; exit 1; }
what="${1:-all}"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$what" = all ] || [ "$what" = backfill ]; then
  cargo test --release -p cairn-osd --test backfill backfill_throughput -- --ignored --nocapture --test-threads=1
fi
if [ "$what" = all ] || [ "$what" = faults ]; then
  cargo test --release -p cairn-cli --test faults recovery_figures -- --ignored --nocapture --test-threads=1
fi
if [ "$what" = mac ]; then
  cargo run --release -p cairn-msg --example mac_speed
fi
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
