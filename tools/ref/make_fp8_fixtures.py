#!/usr/bin/env python3
"""Reference fixtures for the FP8 (E4M3) KV cache (kv_cache_dtype = fp8).

Writes tests/fixtures/fp8/fp8_reference.json:

  {"format": "grpo-fp8-fixture", "version": 1, "torch_version",
   "convert": {"f32_bits": [u32 ints], "e4m3": [u8 ints]},
   "attention": [{"Hq", "Hkv", "D", "seqs": [{"len": L,
        "q": [L*Hq*D ints], "k": [L*Hkv*D ints], "v": [L*Hkv*D ints],   # value = int / 16
        "positions": [P ints], "out": [P*Hq*D floats]}]}]}

`convert`: PyTorch's x.clamp(-448, 448).to(torch.float8_e4m3fn) of float32 inputs
(random at several scales, exact midpoints between neighbouring E4M3 values, the
subnormal range, the saturation edge, ±0, ±inf) — round to nearest even with
saturation, which is what the CUDA cvt.rn.satfinite conversion does.

`attention`: causal attention of one sequence per entry, keys and values stored as
E4M3 (converted by PyTorch), computed in float64: out[p] for query position p attends
to keys 0..p with scale 1/sqrt(D), query head h using kv head h / (Hq / Hkv). Only
the listed positions are stored.

Usage (on a machine with torch): python3 tools/ref/make_fp8_fixtures.py --out tests/fixtures/fp8
"""
import argparse
import json
import math
import os
import struct

import torch


def e4m3(x):
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def convert_cases(gen):
    vals = []
    for s in (1e-4, 3e-3, 0.05, 1.0, 7.0, 60.0, 300.0, 1000.0):
        vals += (torch.randn(200, generator=gen) * s).tolist()
    # every finite E4M3 value and the midpoints between neighbours (ties: round to even)
    allv = torch.arange(0, 256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    fin = sorted(set(v for v in allv.tolist() if not math.isnan(v)))
    vals += fin
    vals += [(a + b) / 2 for a, b in zip(fin, fin[1:])]
    vals += [2.0 ** -6, 2.0 ** -6 * 0.999, 2.0 ** -9, 2.0 ** -10, 2.0 ** -10 * 1.01, 447.9, 448.0, 449.0,
             463.9, 464.0, 464.1, 480.0, 1e10, float("inf"), float("-inf"), 0.0, -0.0]
    x = torch.tensor(vals, dtype=torch.float32)
    bits = [struct.unpack("<I", struct.pack("<f", v))[0] for v in x.tolist()]
    q = e4m3(x).view(torch.uint8).tolist()
    return {"f32_bits": bits, "e4m3": q}


def attention_case(gen, Hq, Hkv, D, lens):
    G = Hq // Hkv
    seqs = []
    for L in lens:
        qi = torch.randint(-48, 49, (L, Hq, D), generator=gen)
        ki = torch.randint(-64, 65, (L, Hkv, D), generator=gen)
        vi = torch.randint(-64, 65, (L, Hkv, D), generator=gen)
        q = qi.double() / 16
        k = e4m3(ki.float() / 16).double()
        v = e4m3(vi.float() / 16).double()
        pos = sorted(set(list(range(0, L, 7)) + [L - 1]))
        out = []
        for p in pos:
            for h in range(Hq):
                g = h // G
                s = (k[: p + 1, g, :] @ q[p, h, :]) / math.sqrt(D)
                w = torch.softmax(s, dim=0)
                out += (w @ v[: p + 1, g, :]).tolist()
        seqs.append({"len": L, "q": qi.flatten().tolist(), "k": ki.flatten().tolist(), "v": vi.flatten().tolist(),
                     "positions": pos, "out": [float("%.9g" % o) for o in out]})
    return {"Hq": Hq, "Hkv": Hkv, "D": D, "seqs": seqs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/fp8")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(1234)
    doc = {"format": "grpo-fp8-fixture", "version": 1, "torch_version": torch.__version__,
           "convert": convert_cases(gen),
           "attention": [attention_case(gen, 8, 2, 64, [1, 37, 150]),   # G = 4 (tensor-core decode shapes)
                         attention_case(gen, 4, 2, 128, [5, 70, 200])]}  # G = 2, D = 128 (Qwen3 shapes)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "fp8_reference.json")
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print(path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
