#!/usr/bin/env python3
"""COMPARE.md from one bench/compare.sh sitting: Cairn's raw outputs beside
Ceph's (parsed with the peer's own report.py) and the fio raw-disk baseline.
Ratios are Cairn / Ceph (or Cairn / fio); the issue targets are printed
beside them so a reader sees at once what is met."""
import argparse
import glob
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ceph", required=True, help="OUT/ceph/raw (holds one dir per media run)")
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--peer", required=True, help="directory of the Ceph peer's report.py")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    sys.path.insert(0, a.peer)
    import report  # the peer's parser: same regexes for both systems' rados bench output

    ceph_dirs = sorted(glob.glob(os.path.join(a.ceph, "*")))
    ceph = report.load_variant(ceph_dirs[0]) if ceph_dirs else None
    cairn = {"rados": {}, "timings": {}, "rss_kb": 0, "rss_phase": {}}
    for p, _, _ in report.RADOS_PHASES:
        cairn["rados"][p] = report.parse_rados(report.rd(os.path.join(a.cairn, f"rados_{p}.txt")))
    for line in (report.rd(os.path.join(a.cairn, "timings.txt")) or "").splitlines():
        k, _, v = line.partition(" ")
        try:
            cairn["timings"][k] = float(v)
        except ValueError:
            pass
    for line in (report.rd(os.path.join(a.cairn, "rss.txt")) or "").splitlines():
        f = line.split()
        if len(f) == 3:
            kb = int(f[2])
            cairn["rss_kb"] = max(cairn["rss_kb"], kb)
            cairn["rss_phase"][f[1]] = max(cairn["rss_phase"].get(f[1], 0), kb)

    out = []
    w = out.append
    w("# Cairn beside Ceph 16 and the raw disk (one sitting)\n")
    if ceph:
        w("Machine: " + " ".join(l for l in (ceph.get("machine") or "").splitlines()[:6] if "=" in l) + "\n")
    w("| phase | Cairn | Ceph | Cairn / Ceph | target |")
    w("|---|---|---|---|---|")
    targets = {
        "rep3_write_4M": ("bw", "≥ 2"), "rep3_seq_4M": ("bw", "≥ 1.2"),
        "rep3_write_4K": ("iops", "≥ 2"), "rep3_rand_4K": ("iops", "≥ 1.2"),
        "ec21_write_4M": ("bw", "≥ 2"), "ec21_seq_4M": ("bw", "≥ 1.2"),
    }
    for p, pool, what in report.RADOS_PHASES:
        key, tgt = targets[p]
        unit = "MB/s" if key == "bw" else "IOPS"
        c = (cairn["rados"].get(p) or {}).get(key)
        e = ((ceph or {}).get("rados", {}).get(p) or {}).get(key) if ceph else None
        ratio = f"**{c / e:.2f}**" if c and e else "–"
        w(f"| {p} ({pool}; {what}) | {report.fmt(c)} {unit if c else ''} | {report.fmt(e)} {unit if e else ''} | {ratio} | {tgt} |")
    # start-up time
    c_up = cairn["timings"].get("dev_up_active_clean")
    e_up = (ceph or {}).get("timings", {}).get("health_ok") if ceph else None
    w(f"| start to all PGs active+clean | {report.fmt(c_up)} s | {report.fmt(e_up)} s (HEALTH_OK) | "
      f"{'**%.2f**' % (c_up / e_up) if c_up and e_up else '–'} | ≤ 0.25 |")
    # memory
    osd_kb = [v for n, v in ((ceph or {}).get("rss") or {}).items() if n.startswith("osd.")]
    ceph_osd = max(osd_kb) if osd_kb else None
    daemon = cairn["rss_kb"] or None
    per_osd = daemon / 3 if daemon else None
    w(f"| max RSS per OSD, MiB (Cairn: whole node daemon = 1 mon + 3 OSDs, ÷ 3) | "
      f"{report.fmt(per_osd / 1024 if per_osd else None)} (daemon {report.fmt(daemon / 1024 if daemon else None)}) | "
      f"{report.fmt(ceph_osd / 1024 if ceph_osd else None)} | {'**%.2f**' % (per_osd / ceph_osd) if per_osd and ceph_osd else '–'} | ≤ 0.25 |")
    w("")
    if ceph:
        w("## Raw disk (fio, same filesystem, same sitting)\n")
        w("| fio job | MB/s | IOPS |")
        w("|---|---|---|")
        for j, desc in report.FIO_JOBS:
            f = ceph["fio"].get(j)
            if f:
                w(f"| {desc} | {f['MBps']:,.1f} | {f['iops']:,.0f} |")
        w("")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
