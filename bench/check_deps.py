#!/usr/bin/env python3
"""Calls between the bench/*.c files, and the file cycles they form (bench/README.md, "Rooms").

For every bench .c file, lists the functions it calls that another bench .c file defines, then
reports every cycle among the files (strongly connected components of the "calls into" graph).
Exit status 0 when there is none, 1 otherwise.

Method: text, no build. Comments, strings and character literals are blanked; a definition is a
top-level identifier followed by a parameter list and an opening brace; a call is an identifier
followed by "(" inside a function body. Both halves of every #ifdef count, so the CUDA and the
stub halves of a file are both seen. Functions a header defines (static inline) belong to no .c
file and are not edges.

usage: check_deps.py [BENCH_DIR]   (default: the directory of this script)
"""
import os
import re
import sys

IDENT = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined", "_Alignof",
            "__attribute__", "alignof", "_Static_assert", "do", "else"}


def strip(text):
    """Blanks comments, string and character literals and preprocessor lines (keeps newlines)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    lines = []
    for line in "".join(out).split("\n"):
        lines.append("" if line.lstrip().startswith("#") else line)
    return "\n".join(lines)


def scan(text):
    """Returns (exported, static, called): top-level function definitions with external linkage,
    static ones, and the identifiers called in function bodies."""
    exported, static, called = set(), set(), set()
    depth, i, n = 0, 0, len(text)
    body_start = None
    while i < n:
        c = text[i]
        if c == "{":
            if depth == 0:
                # A function body when the text before it ends with a parameter list ")".
                head = text[:i].rstrip()
                if head.endswith(")"):
                    k, level = len(head) - 1, 0
                    while k >= 0:
                        level += head[k] == ")"
                        level -= head[k] == "("
                        if level == 0:
                            break
                        k -= 1
                    m = re.search(r"([A-Za-z_]\w*)\s*$", head[:k])
                    if m and m.group(1) not in KEYWORDS:
                        decl = re.split(r"[;}]", head[: m.start()])[-1]
                        (static if re.search(r"\bstatic\b", decl) else exported).add(m.group(1))
                        body_start = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and body_start is not None:
                for m in IDENT.finditer(text, body_start, i):
                    if m.group(1) not in KEYWORDS:
                        called.add(m.group(1))
                body_start = None
        i += 1
    return exported, static, called


def sccs(nodes, edges):
    """Tarjan's strongly connected components."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
            out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    files = sorted(f for f in os.listdir(root) if f.endswith(".c"))
    defs, local, calls = {}, {}, {}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8") as fh:
            defs[f], local[f], calls[f] = scan(strip(fh.read()))
    owner = {}
    for f in files:
        for name in defs[f]:
            owner.setdefault(name, set()).add(f)
    edges = {}
    for f in files:
        print(f"{f}:")
        by_target = {}
        for name in sorted(calls[f] - defs[f] - local[f]):
            for g in sorted(owner.get(name, ())):
                by_target.setdefault(g, []).append(name)
        for g in sorted(by_target):
            edges.setdefault(f, set()).add(g)
            print(f"  -> {g}: {', '.join(by_target[g])}")
        if not by_target:
            print("  (calls no other bench file: a leaf)")
    cycles = [c for c in sccs(files, edges) if len(c) > 1]
    if cycles:
        for c in cycles:
            print("cycle: " + " <-> ".join(c))
        print(f"bench file cycles: {len(cycles)}")
        return 1
    print("bench file cycles: none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
