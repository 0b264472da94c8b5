#!/usr/bin/env bash
# Runs every Cairn test: formatting, lints, unit/property/integration tests
# (including the crushtool oracle, the store crash tests and the real-process
# cluster tests). Installs what the tests need first. Long soak runs are off
# unless CAIRN_SOAK=1.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Run every test binary even when one fails, so the summary names them all.
status=0
cargo test --workspace --all-targets --no-fail-fast 2>&1 | tee "$log" || status=1
cargo test --workspace --doc --no-fail-fast 2>&1 | tee -a "$log" || status=1

# One closing line for the whole run (cargo prints one per test binary).
grep -E '^test result:' "$log" | awk '
  { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;/) p += $(i-1); if ($(i) ~ /^failed;/) f += $(i-1) } }
  END { printf "summary: %d passed, %d failed\n", p, f }'
grep -E '^test .* FAILED$|^error: test failed' "$log" || true
exit $status
