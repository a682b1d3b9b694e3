#!/usr/bin/env python3
"""Reference fixture for the KDE valley curriculum (src/train/curriculum.h).

Writes tests/fixtures/curriculum/kde_cases.json: for each case the EMAs, the
KDE on the grid, every valley with its depth, the chosen cuts, each problem's
cluster, the cluster means and the rollouts per cluster; plus EMA update
sequences. Definitions are those of curriculum.h, implemented here
independently.

  python3 tools/ref/make_kde_fixtures.py            # numpy (the GPU machine)
  python3 tools/ref/make_kde_fixtures.py --stdlib   # pure Python math, no numpy

Both paths write the same cases; densities agree to ~1e-15 relative.
"""
import argparse
import json
import math
import os
import random

SQRT_2PI = math.sqrt(2.0 * math.pi)


def density_stdlib(xs, h, m):
    norm = 1.0 / (len(xs) * h * SQRT_2PI)
    out = []
    for i in range(m):
        x = i / (m - 1)
        out.append(norm * math.fsum(math.exp(-0.5 * ((x - e) / h) ** 2) for e in xs))
    return out


def density_numpy(xs, h, m):
    import numpy as np
    grid = np.arange(m, dtype=np.float64) / (m - 1)
    e = np.asarray(xs, dtype=np.float64)
    u = (grid[:, None] - e[None, :]) / h
    return (np.exp(-0.5 * u * u).sum(axis=1) / (len(xs) * h * SQRT_2PI)).tolist()


def valleys(d):
    """Runs of equal values d[i..k], 1 <= i <= k <= m-2, lower than both neighbours."""
    m = len(d)
    out = []
    i = 1
    while i < m - 1:
        k = i
        while k + 1 < m and d[k + 1] == d[i]:
            k += 1
        if k + 1 < m and d[i - 1] > d[i] and d[k + 1] > d[k]:
            depth = min(max(d[:i]), max(d[k + 1:])) - d[i]
            out.append({"index": i, "x": i / (m - 1), "density": d[i], "depth": depth})
        i = k + 1
    return out


def select_cuts(vs, n_clusters):
    ranked = sorted(vs, key=lambda v: (-v["depth"], v["index"]))
    cuts = [v for v in ranked if v["depth"] > 0][: n_clusters - 1]
    return sorted(cuts, key=lambda v: v["index"])


def cluster_of(e, cuts):
    return sum(1 for c in cuts if e > c["x"])


def group_size(base, alpha, mean, cap):
    if mean is None:
        return base
    g = math.floor(base * (1.0 + alpha * (1.0 - mean)) + 0.5)
    if cap > 0:
        g = min(g, cap)
    return max(g, 1)


def make_case(name, emas, n_clusters, base, alpha, cap, density_fn, h=0.05, m=512):
    d = density_fn(emas, h, m)
    vs = valleys(d)
    cuts = select_cuts(vs, n_clusters)
    assign = [cluster_of(e, cuts) for e in emas]
    means, sizes = [], []
    for k in range(len(cuts) + 1):
        members = [e for e, a in zip(emas, assign) if a == k]
        sizes.append(len(members))
        means.append(math.fsum(members) / len(members) if members else None)
    return {
        "name": name, "emas": emas, "bandwidth": h, "grid_points": m, "n_clusters": n_clusters,
        "base": base, "alpha": alpha, "max_generations": cap,
        "density": d, "valleys": vs, "cuts": [c["index"] for c in cuts], "assignment": assign,
        "cluster_sizes": sizes, "cluster_means": means,
        "group_sizes": [group_size(base, alpha, mu, cap) for mu in means],
    }


def make_ema_case(name, init, decay, n, steps):
    """steps: list of (indices, rewards); ema = clip(decay*ema + (1-decay)*r, 0, 1)."""
    ema = [init] * n
    for idx, rew in steps:
        for i, r in zip(idx, rew):
            ema[i] = min(1.0, max(0.0, decay * ema[i] + (1.0 - decay) * r))
    return {"name": name, "init": init, "decay": decay, "n": n,
            "steps": [{"indices": i, "rewards": r} for i, r in steps], "ema": ema}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stdlib", action="store_true", help="pure Python math (no numpy)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures",
                                                  "curriculum", "kde_cases.json"))
    args = ap.parse_args()
    dens = density_stdlib if args.stdlib else density_numpy
    rng = random.Random(18)

    def around(c, s, n):
        return [min(1.0, max(0.0, rng.gauss(c, s))) for _ in range(n)]

    cases = [
        make_case("bimodal", around(0.1, 0.04, 30) + around(0.85, 0.05, 20), 2, 8, 1.0, 0, dens),
        make_case("trimodal_3", around(0.05, 0.03, 25) + around(0.5, 0.04, 15) + around(0.95, 0.03, 20), 3, 8, 1.0, 0, dens),
        make_case("trimodal_2", around(0.05, 0.03, 25) + around(0.5, 0.04, 15) + around(0.95, 0.03, 20), 2, 4, 0.5, 0, dens),
        make_case("five_modes_cap", around(0.0, 0.02, 10) + around(0.25, 0.02, 12) + around(0.5, 0.03, 9)
                  + around(0.75, 0.02, 14) + around(1.0, 0.02, 11), 4, 8, 2.0, 20, dens),
        make_case("all_init", [0.5] * 40, 3, 8, 1.0, 0, dens),
        make_case("skewed_two", around(0.2, 0.08, 40) + around(0.7, 0.03, 10), 3, 6, 1.0, 0, dens),
        make_case("hard_easy_exact", [0.0] * 10 + [0.9] * 10, 2, 7, 1.0, 0, dens),
        make_case("random_wide", [rng.random() for _ in range(200)], 5, 8, 1.0, 0, dens),
    ]
    ema_cases = [
        make_ema_case("updates_with_clip", 0.5, 0.7, 5,
                      [([0, 1, 2], [1.0, 0.0, 0.5]), ([0, 3], [1.0, -2.0]), ([0, 1, 4], [1.6, 0.25, 3.0]),
                       ([2, 3], [0.75, 0.1])]),
    ]
    for c in cases:
        # A valley whose depth is rounding noise would make the test depend on summation order.
        for v in c["valleys"]:
            assert v["depth"] > 1e-6, (c["name"], v)
    out = {"format": "grpo.cpp kde curriculum fixture v1",
           "generator": "tools/ref/make_kde_fixtures.py" + (" --stdlib" if args.stdlib else ""),
           "cases": cases, "ema_cases": ema_cases}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote", args.out, len(cases), "cases")


if __name__ == "__main__":
    main()
