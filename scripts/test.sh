#!/usr/bin/env bash
# Runs every Cairn test: formatting, lints, unit/property/integration tests
# (including the crushtool oracle and the store crash tests). Installs what
# the tests need first. Long soak runs are off unless CAIRN_SOAK=1.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --all-targets
cargo test --workspace --doc
