#!/usr/bin/env python3
"""The house's own figures, from the sources as they stand: crates, files and lines per floor,
functions over 80 lines (and over 120), and file circles (files that import each other in a loop,
through `crate::…`, `super::…` and `self::…` paths, in `use` items and in code; a module's face,
its `mod.rs` handing on its own children's items, is not counted as importing them).

    python3 scripts/house.py            # the figures
    python3 scripts/house.py --long     # and every function over 80 lines, longest first

Reads text only: a function is its `fn` line to the line of its closing brace (tests included,
`#[cfg(test)]` modules too), and an import is a `use` item. Comments and strings are stripped
before anything is counted as code.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The floors, bottom up: (name, the crate's source folder).
FLOORS = [
    ("deltascope-model", "crates/model/src"),
    ("deltascope-protocol", "crates/protocol/src"),
    ("deltascope-engine", "crates/engine/src"),
    ("deltascope (top)", "src"),
]


def rust_files(src):
    out = []
    for dirpath, _, names in os.walk(os.path.join(ROOT, src)):
        out += [os.path.join(dirpath, n) for n in names if n.endswith(".rs")]
    return sorted(out)


def strip(text):
    """Comments and string / char literals blanked (newlines kept, so line numbers hold)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 0, i
            while j < n:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                    if depth == 0:
                        break
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == '"' or (c == "r" and re.match(r'r#*"', text[i:i + 10]) and not re.match(r"\w", text[i - 1:i] or " ")):
            m = re.match(r'r(#*)"', text[i:])
            if m:
                close = '"' + m.group(1)
                j = text.find(close, i + len(m.group(0)))
                j = n if j < 0 else j + len(close)
            else:
                j = i + 1
                while j < n and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                j += 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == "'" and re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12]):
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(code):
    """(name, first line, line count) of every fn with a body."""
    out = []
    for m in re.finditer(r"\bfn\s+(\w+)", code):
        j = m.end()
        depth = 0
        # The body opens at the first `{` outside the signature's parentheses / generics.
        while j < len(code) and not (code[j] == "{" and depth == 0):
            if code[j] in "(<[":
                depth += 1
            elif code[j] in ")>]" and not (code[j] == ">" and code[j - 1] == "-"):
                depth -= 1
            elif code[j] == ";" and depth == 0:
                break
            j += 1
        if j >= len(code) or code[j] != "{":
            continue
        k, depth = j, 0
        while k < len(code):
            if code[k] == "{":
                depth += 1
            elif code[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, k) + 1
        out.append((m.group(1), first, last - first + 1))
    return out


def module_of(path, src):
    rel = os.path.relpath(path, os.path.join(ROOT, src))[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def use_paths(code):
    """Every path of every `use` item, its groups expanded."""
    paths = []

    def expand(prefix, tree):
        parts, depth, cur = [], 0, ""
        for ch in tree:
            if ch == "{":
                depth += 1
            if ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        for p in (p.strip() for p in parts):
            if not p:
                continue
            m = re.match(r"^([\w:]*?)::\{(.*)\}$", p, re.S)
            if m:
                expand(prefix + [s for s in m.group(1).split("::") if s], m.group(2))
            elif p.startswith("{") and p.endswith("}"):
                expand(prefix, p[1:-1])
            else:
                paths.append(prefix + [s for s in p.split("::") if s])

    # Paths written in code (`crate::a::b()`, `super::x::Y`), outside `use` items.
    for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)", re.sub(r"\buse\s+[^;]+;", "", code)):
        paths.append(m.group(1).split("::"))
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        tree = re.sub(r"\s+as\s+\w+", "", m.group(1))
        expand([], re.sub(r"\s+", "", tree))
    return paths


def circles(src, files, codes):
    """Strongly connected sets of more than one file, by `use` paths inside one crate."""
    module_file = {tuple(module_of(f, src)): f for f in files}
    edges = {f: set() for f in files}
    for f in files:
        here = module_of(f, src)
        if os.path.basename(f) not in ("mod.rs", "lib.rs", "main.rs"):
            parent = here[:-1]
        else:
            parent = here[:-1] if here else []
        for p in use_paths(codes[f]):
            if not p:
                continue
            if p[0] == "crate":
                abs_ = p[1:]
            elif p[0] == "super":
                base = list(parent if os.path.basename(f) not in ("mod.rs", "lib.rs") else here[:-1])
                rest = p[1:]
                while rest and rest[0] == "super":
                    base, rest = base[:-1], rest[1:]
                abs_ = base + rest
            elif p[0] == "self":
                abs_ = here + p[1:]
            else:
                continue
            # The longest module prefix that is a file. A module's face (`mod.rs`, `lib.rs`)
            # handing on its own children's items is not an import of theirs.
            for k in range(len(abs_), 0, -1):
                target = module_file.get(tuple(abs_[:k]))
                if target:
                    is_face = os.path.basename(f) in ("mod.rs", "lib.rs") and tuple(abs_[: len(here)]) == tuple(here)
                    if target != f and not is_face:
                        edges[f].add(target)
                    break
    # Tarjan's strongly connected components.
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in files:
        if v not in index:
            visit(v)
    return out


def main():
    long_list = "--long" in sys.argv
    total_long, total_longer, all_circles, rows, longs = 0, 0, [], [], []
    for name, src in FLOORS:
        files = rust_files(src)
        codes = {f: strip(open(f, encoding="utf-8").read()) for f in files}
        lines = sum(open(f, encoding="utf-8").read().count("\n") for f in files)
        fns = [(n, f, first, count) for f in files for (n, first, count) in functions(codes[f])]
        over80 = [x for x in fns if x[3] > 80]
        over120 = [x for x in fns if x[3] > 120]
        total_long += len(over80)
        total_longer += len(over120)
        longs += over80
        found = circles(src, files, codes)
        all_circles += found
        rows.append((name, len(files), lines, len(over80), len(over120), len(found)))
    print(f"{'crate':<22} {'files':>5} {'lines':>7} {'fns>80':>7} {'fns>120':>8} {'circles':>8}")
    for r in rows:
        print(f"{r[0]:<22} {r[1]:>5} {r[2]:>7} {r[3]:>7} {r[4]:>8} {r[5]:>8}")
    print(f"{'all':<22} {sum(r[1] for r in rows):>5} {sum(r[2] for r in rows):>7} {total_long:>7} {total_longer:>8} {len(all_circles):>8}")
    for c in all_circles:
        print("circle: " + " <-> ".join(os.path.relpath(f, ROOT) for f in c))
    if long_list:
        for n, f, first, count in sorted(longs, key=lambda x: -x[3]):
            print(f"{count:>4}  {os.path.relpath(f, ROOT)}:{first}  fn {n}")


if __name__ == "__main__":
    main()
