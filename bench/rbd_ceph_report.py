#!/usr/bin/env python3
"""Table for bench/rbd-ceph.sh: reads OUT_DIR (rbd bench / cairn rbd bench
outputs, fio JSON, phases.txt) and prints Markdown with Cairn / Ceph ratios,
CPU seconds per GiB moved and the issue's targets."""
import json
import os
import re
import shlex
import sys

out = sys.argv[1]
SIZES = {"4K": 4096, "1M": 1 << 20}


def phases():
    p = {}
    path = os.path.join(out, "phases.txt")
    if not os.path.exists(path):
        return p
    for line in open(path):
        parts = shlex.split(line)
        if not parts:
            continue
        p[parts[0]] = dict(kv.split("=", 1) for kv in parts[1:])
    return p


PH = phases()


def rbd_bench(side, typ, size, suffix=""):
    """(ops/s, bytes/s, bytes moved) from an rbd bench summary line."""
    path = os.path.join(out, side, f"rbd_bench_{typ}_{size}{suffix}.txt")
    if not os.path.exists(path):
        return None
    m = None
    for line in open(path):
        m = re.search(r"elapsed:\s*([\d.]+)\s+ops:\s*(\d+)\s+ops/sec:\s*([\d.]+)", line) or m
    if not m:
        return None
    ops_s = float(m.group(3))
    return ops_s, ops_s * SIZES[size], int(m.group(2)) * SIZES[size]


def fio(name):
    path = os.path.join(out, f"{name}.json")
    if not os.path.exists(path):
        return None
    try:
        text = open(path).read()
        # fio's nbd engine prints a line of its own before the JSON.
        j = json.loads(text[text.index("{"):])["jobs"][0]
    except (ValueError, KeyError, IndexError):
        return None
    side = j["write"] if j["write"]["io_bytes"] else j["read"]
    return side["iops"], side["bw_bytes"], side["io_bytes"]


def cpu_per_gib(phase, moved):
    p = PH.get(phase)
    if not p or not moved:
        return "—"
    s = float(p.get("server_cpu_s", 0))
    c = float(p.get("client_cpu_s", 0))
    gib = moved / 2**30
    return f"{s / gib:.1f} + {c / gib:.1f}"


def load(phase):
    p = PH.get(phase)
    return p["load_before"].split()[0] if p and "load_before" in p else "—"


def fmt(v, size):
    if v is None:
        return "—"
    return f"{v[0]:,.0f} IOPS" if size == "4K" else f"{v[1] / 2**20:,.1f} MiB/s"


def ratio(a, b, size):
    if a is None or b is None:
        return "—"
    i = 0 if size == "4K" else 1
    return f"**{a[i] / b[i]:.2f}**" if b[i] else "—"


print("| workload | Ceph 16 | Cairn | Cairn / Ceph | CPU s per GiB, servers + client (Ceph / Cairn) | load (Ceph / Cairn) |")
print("|---|---|---|---|---|---|")
rows = []
for typ, size, pat, thr, sfx in [("write", "4K", "rand", "32", ""), ("read", "4K", "rand", "32", ""),
                                 ("write", "4K", "seq", "16", "seq"),
                                 ("write", "1M", "seq", "16", ""), ("read", "1M", "seq", "16", "")]:
    c = rbd_bench("ceph", typ, size, sfx)
    k = rbd_bench("cairn", typ, size, sfx)
    if c is None and k is None:
        continue
    rows.append((f"rbd bench {typ} {size} {pat} -t {thr}", c, k, size,
                 f"ceph_rbd_bench_{typ}_{size}{sfx}", f"cairn_rbd_bench_{typ}_{size}{sfx}"))
for job, size in [("randwrite_4k", "4K"), ("write_1m", "1M"), ("read_1m", "1M")]:
    c = fio(f"ceph_fio_{job}")
    for via in ["nbd", "map"]:
        k = fio(f"cairn_fio_{via}_{job}")
        if k is None and via == "map":
            continue
        rows.append((f"fio {job} (Ceph: librbd engine; Cairn: {via})", c, k, size,
                     f"ceph_fio_{job}", f"cairn_fio_{via}_{job}"))
for name, c, k, size, pc, pk in rows:
    cpu = f"{cpu_per_gib(pc, c[2] if c else 0)} / {cpu_per_gib(pk, k[2] if k else 0)}"
    print(f"| {name} | {fmt(c, size)} | {fmt(k, size)} | {ratio(k, c, size)} | {cpu} | {load(pc)} / {load(pk)} |")

print()
ceph_w4 = rbd_bench("ceph", "write", "4K")
ceph_w1 = rbd_bench("ceph", "write", "1M")
print("Targets (against Ceph's `rbd bench`):")
for label, cands, base, idx, want in [
    ("4 KiB write IOPS ≥ 2×", [("cairn rbd bench", rbd_bench("cairn", "write", "4K")),
                               ("fio via NBD", fio("cairn_fio_nbd_randwrite_4k")),
                               ("fio via map", fio("cairn_fio_map_randwrite_4k"))], ceph_w4, 0, 2.0),
    ("1 MiB write bandwidth ≥ 1.5×", [("cairn rbd bench", rbd_bench("cairn", "write", "1M")),
                                      ("fio via NBD", fio("cairn_fio_nbd_write_1m")),
                                      ("fio via map", fio("cairn_fio_map_write_1m"))], ceph_w1, 1, 1.5),
]:
    parts = []
    for n, v in cands:
        if v is None or base is None or not base[idx]:
            continue
        r = v[idx] / base[idx]
        parts.append(f"{n} {r:.2f}× ({'met' if r >= want else 'missed'})")
    print(f"- {label}: " + ("; ".join(parts) if parts else "no figures"))
rados = os.path.join(out, "cairn", "rados_bench_write_4k.txt")
if os.path.exists(rados):
    for line in open(rados):
        if "Average IOPS" in line:
            print(f"- `cairn rados bench` 4 KiB writes on the same pool: {line.split(':', 1)[1].strip()} IOPS")
m = os.path.join(out, "machine.txt")
if os.path.exists(m):
    print("\n```\n" + open(m).read().strip() + "\n```")
