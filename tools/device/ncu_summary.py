"""Sums Nsight Compute's per-kernel gpu__time_duration (ncu --csv --page raw) by kernel name."""
import csv
import sys
from collections import defaultdict


def main(path):
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if '"Kernel Name"' in l), None)
    if start is None:
        print("no ncu table in", path)
        print("\n".join(lines[-20:]))
        return
    rows = list(csv.reader(lines[start:]))
    head = rows[0]
    kn, tm = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    unit = rows[1][tm] if len(rows) > 1 else ""
    tot, cnt = defaultdict(float), defaultdict(int)
    for r in rows[1:]:
        if len(r) <= tm:
            continue
        try:
            v = float(r[tm].replace(",", ""))
        except ValueError:
            continue
        name = r[kn].split("(")[0][:90]
        tot[name] += v
        cnt[name] += 1
    scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0}.get(unit, 1e-6)
    all_ms = sum(tot.values()) * scale
    print(f"total kernel time {all_ms:.2f} ms over {sum(cnt.values())} kernels (unit {unit})")
    for name, v in sorted(tot.items(), key=lambda x: -x[1])[:30]:
        print(f"{v * scale:10.3f} ms {100 * v * scale / all_ms:5.1f}% {cnt[name]:6d}x  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
