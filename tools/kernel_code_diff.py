#!/usr/bin/env python3
"""Compares the machine code of every CUDA kernel in two sets of nvcc object files.

For refactors that only move kernel code between files: build the library before and
after, copy the objects aside, and run
    python3 tools/kernel_code_diff.py --before OLD/*.cu.o --after NEW/*.cu.o
Each object's embedded sm_XX cubin (an ELF inside the fatbinary, uncompressed with the
project's flags) is parsed with the standard library; per kernel it compares the bytes
of `.text.<kernel>` (the SASS instructions, what `cuobjdump -sass` disassembles), the
shared-memory size and the parameter-bank size. Kernels are matched by demangled name
after --normalize rewrites (regular expressions, "pattern=>replacement"), so that a
namespace or file-local rename does not count as a change. Exit status 0 when every
kernel is identical and none appeared or disappeared, 1 otherwise.
Needs c++filt (binutils) for demangling.
"""
import argparse
import re
import struct
import subprocess
import sys


def embedded_cubins(blob):
    """ELF images inside an object file, skipping the host ELF at offset 0."""
    out = []
    pos = blob.find(b"\x7fELF", 1)
    while pos >= 0:
        if blob[pos + 4] == 2:  # ELFCLASS64
            shoff, = struct.unpack_from("<Q", blob, pos + 0x28)
            shentsize, shnum = struct.unpack_from("<HH", blob, pos + 0x3A)
            end = pos + shoff + shentsize * shnum
            if end <= len(blob):
                out.append(blob[pos:end])
                pos = blob.find(b"\x7fELF", end)
                continue
        pos = blob.find(b"\x7fELF", pos + 4)
    return out


def sections(elf):
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize)
        heads.append((name, typ, off, size))
    stroff = heads[shstrndx][2]
    res = {}
    for name, typ, off, size in heads:
        end = elf.index(b"\0", stroff + name)
        sname = elf[stroff + name:end].decode()
        res[sname] = (typ, elf[off:off + size] if typ != 8 else b"", size)  # 8: SHT_NOBITS
    return res


def kernels_of(paths):
    """mangled name -> (text bytes, shared size, param bank size, file)."""
    res = {}
    for p in paths:
        cubins = embedded_cubins(open(p, "rb").read())
        if not cubins:
            sys.exit(f"{p}: no embedded cubin (compressed fatbinary? build without -Xfatbin -compress-all)")
        for elf in cubins:
            secs = sections(elf)
            for sname, (_t, data, _s) in secs.items():
                if not sname.startswith(".text."):
                    continue
                k = sname[len(".text."):]
                shared = secs.get(".nv.shared." + k, (0, b"", 0))[2]
                params = secs.get(".nv.constant0." + k, (0, b"", 0))[2]
                res[k] = (data, shared, params, p)
    return res


def demangle(names):
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    ap.add_argument("--normalize", action="append", default=[], help="PATTERN=>REPLACEMENT on demangled names")
    a = ap.parse_args()
    rules = []
    for r in a.normalize:
        if "=>" not in r:
            sys.exit(f"--normalize {r!r}: expected PATTERN=>REPLACEMENT")
        pat, rep = r.split("=>", 1)
        rules.append((re.compile(pat), rep))

    def keyed(ks):
        dm = demangle(sorted(ks))
        res = {}
        for m, v in ks.items():
            n = dm[m]
            for pat, rep in rules:
                n = pat.sub(rep, n)
            if n in res:
                sys.exit(f"two kernels normalise to {n!r}; make --normalize less broad")
            res[n] = v
        return res

    before, after = keyed(kernels_of(a.before)), keyed(kernels_of(a.after))
    same = changed = 0
    for n in sorted(set(before) | set(after)):
        if n not in after:
            print(f"REMOVED  {n}  ({before[n][3]})")
            changed += 1
        elif n not in before:
            print(f"ADDED    {n}  ({after[n][3]})")
            changed += 1
        elif before[n][:3] != after[n][:3]:
            b, f = before[n], after[n]
            print(f"CHANGED  {n}: {len(b[0])} -> {len(f[0])} code bytes, shared {b[1]} -> {f[1]}, params {b[2]} -> {f[2]}")
            changed += 1
        else:
            same += 1
    print(f"{same} kernels identical, {changed} removed/added/changed")
    return 0 if changed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
