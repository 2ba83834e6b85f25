"""Which kernels two builds of octopus compiled differently: per-kernel SASS of two ``_C``
libraries (``cuobjdump -sass``), addresses, encodings and section identifiers dropped,
names matched across builds (the hashes nvcc puts in anonymous-namespace names ignored).
A change that should not touch device code (a refactor of constants, a host-side change)
is checked with it before its benchmark noise is read as a difference.

    python benchmarks/sass_diff.py BASE/_C*.so NEW/_C*.so [--rename OLD=NEW ...]

``--rename`` maps a kernel name pattern of the base onto the new one (a regular expression
and its replacement), for kernels whose template arguments changed on purpose.
"""

import argparse
import difflib
import re
import subprocess
import sys

ANONYMOUS = re.compile(r"(\d+)_GLOBAL__N__")


def without_hashes(name: str) -> str:
    """The mangled name with each anonymous namespace (its length prefix says how long it
    is; nvcc names it after a hash of the file) replaced by ANON."""
    out, i = [], 0
    for match in ANONYMOUS.finditer(name):
        if match.start() < i:
            continue
        out.append(name[i:match.start()] + "ANON")
        i = match.start(1) + len(match.group(1)) + int(match.group(1))
    return "".join(out) + name[i:]


HEADER = ("identifier", "code for", "Fatbin", "=====", "arch =", "code version", "host =", "compile_size")


def kernels(library: str) -> dict:
    """{(architecture, kernel name): its SASS lines} of a library."""
    return parse(subprocess.run(["cuobjdump", "-sass", library], capture_output=True, text=True, check=True).stdout)


def parse(text: str) -> dict:
    funcs: dict = {}
    arch, key = "?", None
    for line in text.splitlines():
        code_for = re.search(r"code for (sm_\w+)", line)
        if code_for:
            arch = code_for.group(1)
            continue
        match = re.match(r"\s*Function : (\S+)", line)
        if match:
            key = (arch, without_hashes(match.group(1)))
            funcs[key] = []
            continue
        line = re.sub(r"/\*\s*[0-9a-fx]+\s*\*/", "", line).strip()  # addresses and encodings
        if key is not None and line and not line.startswith(HEADER):
            funcs[key].append(line)
    return funcs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument("--rename", nargs="*", default=[], metavar="OLD=NEW")
    args = parser.parse_args(argv)
    base, new = kernels(args.base), kernels(args.new)
    for rule in args.rename:
        old, _, replacement = rule.partition("=")
        base = {(arch, re.sub(old, replacement, name)): v for (arch, name), v in base.items()}
    common = sorted(set(base) & set(new))
    different = [k for k in common if base[k] != new[k]]
    print(f"kernels: base {len(base)}, new {len(new)}, in both {len(common)}, "
          f"identical SASS {len(common) - len(different)}")
    for label, names in (("only in base", set(base) - set(new)), ("only in new", set(new) - set(base))):
        for arch, name in sorted(names):
            print(f"{label}: {arch} {name}")
    for k in different:
        diff = list(difflib.unified_diff(base[k], new[k], lineterm="", n=0))
        print(f"different: {k[0]} {k[1]} ({len(base[k])} / {len(new[k])} lines, {len(diff)} diff lines)")
        print("\n".join(diff[:12]))
    return 0 if not different and set(base) == set(new) else 1


if __name__ == "__main__":
    sys.exit(main())
