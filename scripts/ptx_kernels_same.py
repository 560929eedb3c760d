#!/usr/bin/env python3
"""Whether every kernel of an old PTX file is in a new one with the same instructions.

For changes meant to leave the production kernels alone (a benchmark's form of a kernel added
as a template argument, a comment): compile the .cu file to PTX before and after, e.g.

  nvcc -I. -arch=sm_90a -std=c++17 -x cu -ptx kernels/attention.cu -o /tmp/new.ptx

(`git stash` for the old), then `scripts/ptx_kernels_same.py /tmp/old.ptx /tmp/new.ptx`. Names
that differ only by the anonymous namespace's hash, new defaulted template arguments of 0 or
false (`ELj0E`, `ELb0E`), the numbering of labels and local depots, blank lines, and static
shared variables moved from the kernel into a device function it calls (same name, alignment and
size) count as the same. Exit 0 when every old kernel is unchanged, 1 otherwise (each changed or
missing kernel named).
"""
import re
import sys


def kernels(path):
    text = open(path).read()
    # Static shared variables, declared in their kernel or (moved into a device function it
    # calls) at the module's level: each use becomes its own name with its alignment and size,
    # and the declarations go, so a move compares equal and a resize does not.
    shared = {symbol: f"shared:{name}[{align},{size}]" for align, symbol, name, size in re.findall(
        r"\.shared \.align (\d+) \.b8 (_ZZ\w+?\d+([a-z_][a-z_0-9]*))\[(\d+)\];", text)}
    lines = text.split("\n")
    found, i = {}, 0
    while i < len(lines):
        if ".entry " in lines[i] and not lines[i].startswith("//"):
            j = i
            while lines[j] != "}":
                j += 1
            body = "\n".join(lines[i:j + 1])
            body = re.sub(r"\t// demoted variable\n\t\.shared [^\n]*\n", "", body)
            body = re.sub(r"\b_ZZ\w+\b", lambda m: shared.get(m.group(0), m.group(0)), body)
            body = re.sub(r"_GLOBAL__N__\w+?_cu_[0-9a-f]{8}", "ANON", body)
            body = body.replace("ELb0EEEv", "EEEv").replace("ELj0EEEv", "EEEv")
            body = re.sub(r"\$L__BB\d+_", "$L__BB_", body)
            body = re.sub(r"__local_depot\d+", "__local_depot", body)
            body = re.sub(r"\n\s*\n", "\n", body)  # blank lines
            found[body.split("\n")[0]] = body
            i = j
        i += 1
    return found


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: ptx_kernels_same.py OLD.ptx NEW.ptx")
    old, new = kernels(sys.argv[1]), kernels(sys.argv[2])
    changed = [name for name, body in old.items() if new.get(name) != body]
    print(f"{len(old) - len(changed)} of {len(old)} kernels of the old PTX unchanged in the new; "
          f"the new has {len(new)}")
    for name in changed:
        print("changed or missing:", name[:160])
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
