#!/usr/bin/env bash
# Recovery figures (issue 6): runs the ignored test `recovery_figures` of
# crates/cli/tests/faults.rs in a release build. It starts three host
# daemons x two OSDs on 127.0.x.y (heartbeat grace 3 s), measures fio's
# sequential write bandwidth on the disk holding the cluster (same run),
# then prints: the time from kill -9 of a host to every PG active again
# (three runs), log-based recovery throughput after an outage during which
# 4 MiB objects were written, and backfill throughput after an OSD is lost
# and marked out, each as MB/s and as a ratio of fio's bandwidth.
# Usage: bench/recovery.sh     (TMPDIR selects the disk; needs fio, ~12 GB free)
# Env: CARGO_TARGET_DIR as usual.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)" >&2; exit 1; }
exec cargo test --release -p cairn-cli --test faults recovery_figures -- --ignored --nocapture --test-threads=1
