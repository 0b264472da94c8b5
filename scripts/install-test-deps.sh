#!/usr/bin/env bash
# Installs what Cairn's tests need on a fresh Debian/Ubuntu machine. Idempotent:
# each tool is installed only when missing. Needs root (or sudo) for apt-get.
set -euo pipefail

need_apt=()
want() { # want COMMAND DEBIAN_PACKAGE
  command -v "$1" >/dev/null 2>&1 || need_apt+=("$2")
}
want crushtool ceph-base    # the CRUSH oracle (Ceph's own crushtool)
want fio fio                # raw-disk baselines in bench/
want faketime faketime      # clock-skew tests
want qemu-io qemu-utils      # NBD tests with a real client (qemu-io, qemu-img)
want nbdinfo libnbd-bin     # NBD tests with a real client (nbdinfo)
want mkfs.xfs xfsprogs      # cairn rbd map test (mkfs.xfs, xfs_repair, as in the seed)
want ip iproute2            # partition tests build hosts with ip netns + veth
# cairn rbd map's FUSE mount needs fusermount (fuse3 ships fusermount3)
command -v fusermount3 >/dev/null 2>&1 || command -v fusermount >/dev/null 2>&1 || need_apt+=(fuse3)

if ((${#need_apt[@]})); then
  SUDO=""
  [[ $(id -u) == 0 ]] || SUDO="sudo"
  echo "installing: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
fi
