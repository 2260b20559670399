#!/usr/bin/env python3
"""The tree's rooms and the arrows between them (docs/DESIGN.md, "Map of rooms"). Fails (exit 1)
when the files form a circle anywhere in the tree, or when a room includes a room it may not.

Units. A C unit is the files of one directory that share a stem: cuda_gemm.c and cuda_gemm.h are
one unit, because a header belongs to the source file of its name. A header named after the top
layer of a room therefore makes every file that includes it depend on that layer (the old
backend_cuda/cuda_backend.h did: cuda_backend.c <-> cuda_status.c <-> cuda_transport_flags.c).
A Python unit is one module of python/tpflex (a package is its __init__.py).

Arrows, unit A -> unit B, when a file of A
- includes a file of B: #include "x" resolved as the build does (the includer's directory, then
  include/, then the tree's one file with that path; system headers are not units);
- calls a function that a .c or .cu file of B defines: text, no build. Comments, strings and
  preprocessor lines are blanked; a definition is a top-level name followed by a parameter list
  and a brace; static functions, and names defined in more than one file (each program's main),
  make no arrows. Both halves of an #ifdef count;
- (Python) imports B, at module level or inside a function. Imports under `if TYPE_CHECKING:` are
  for annotations only and make no arrow.
A circle is a strongly connected component of more than one unit (Tarjan).

Rooms. A file's room is its top directory (python/tpflex is "python", the public headers are
"include"), or a sub-room of SUBROOMS (tools/bench, the tools' library). ALLOWED below says which rooms each room's files may #include; docs/DESIGN.md's map
of rooms says the same in words and must change with it.

usage: check_rooms.py [ROOT] [-v]   (ROOT: the repository, default this script's parent's parent;
-v lists every arrow between units)
       check_rooms.py --self-test    (the checker finds circles and a room violation it is shown)
"""
import ast
import os
import re
import sys

# Which rooms a room's C files may include (its own is always allowed). The public headers
# (include/) are the only room every other C room may use.
ALLOWED = {
    "include": set(),
    "core": {"include"},
    "backend_sim": {"include"},
    "backend_cuda": {"include"},
    "harness": {"include", "core"},
    "tools/bench": {"include", "core", "harness"},
    "tools": {"include", "harness", "tools/bench"},
    "fuzz": {"include"},
    "examples": {"include"},
}
# Tests sit above everything: white-box tests may include any room.
ALLOWED["tests"] = set(ALLOWED)
SKIP_DIRS = {".git", ".deps", "coverage", "data", "docs", "__pycache__", "scripts"}
C_EXT = (".c", ".h", ".cu", ".inc")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
CALL_RE = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined", "_Alignof", "do",
            "else", "alignof", "_Static_assert", "__attribute__", "__launch_bounds__"}


def blank(text):
    """Comments, string and character literals and preprocessor lines blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text[i] in "\"'":
            j = i + 1
            while j < n and text[j] != text[i] and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "\n".join("" if ln.lstrip().startswith("#") else ln for ln in "".join(out).split("\n"))


def functions(text):
    """(defined with external linkage, called) names of a blanked C file."""
    defined, called = set(), set()
    depth, body = 0, None
    for i, c in enumerate(text):
        if c == "{":
            if depth == 0:
                head = text[:i].rstrip()
                if head.endswith(")"):
                    k, level = len(head) - 1, 0
                    while k > 0:
                        level += {")": 1, "(": -1}.get(head[k], 0)
                        if level == 0:
                            break
                        k -= 1
                    m = re.search(r"([A-Za-z_]\w*)\s*$", head[:k])
                    if m and m.group(1) not in KEYWORDS:
                        decl = re.split(r"[;}]", head[: m.start()])[-1]
                        if not re.search(r"\bstatic\b", decl):
                            defined.add(m.group(1))
                        body = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and body is not None:
                called.update(m.group(1) for m in CALL_RE.finditer(text, body, i))
                body = None
    return defined, called - KEYWORDS


def walk(root):
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")
                         and not (rel == "." and d == "python"))
        for f in sorted(files):
            if f.endswith(C_EXT):
                yield os.path.normpath(os.path.join(rel, f))


# Rooms inside a room: tools/bench is the tools' library, below the tool (it includes nothing of
# tools/ itself).
SUBROOMS = ("tools/bench",)


def room_of(path):
    for sub in SUBROOMS:
        if path == sub or path.startswith(sub + os.sep):
            return sub
    top = path.split(os.sep)[0]
    return "python" if top == "python" else top


def unit_of(path):
    if path.endswith(".py"):
        return path[: -len("/__init__.py")] if path.endswith("/__init__.py") else path[:-3]
    return os.path.splitext(path)[0]


def c_arrows(root, files):
    """(unit, unit, why) for every include and call between C files of different units."""
    by_suffix = {}
    for f in files:
        parts = f.split(os.sep)
        for k in range(len(parts)):
            by_suffix.setdefault(os.path.join(*parts[k:]), []).append(f)
    arrows, texts = [], {}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            texts[f] = fh.read()
        for inc in INCLUDE_RE.findall(texts[f]):
            cands = [os.path.normpath(os.path.join(os.path.dirname(f), inc)),
                     os.path.normpath(os.path.join("include", inc))]
            target = next((c for c in cands if c in texts or os.path.isfile(os.path.join(root, c))),
                          None)
            if target is None:
                found = by_suffix.get(os.path.normpath(inc), [])
                target = found[0] if len(found) == 1 else None
            if target is not None:
                arrows.append((f, target, f'#include "{inc}"'))
    owner, called = {}, {}
    for f in files:
        if f.endswith((".c", ".cu")):
            defined, called[f] = functions(blank(texts[f]))
            for name in defined:
                owner.setdefault(name, []).append(f)
    for f, names in called.items():
        for name in sorted(names):
            where = owner.get(name, [])
            if len(where) == 1 and where[0] != f:
                arrows.append((f, where[0], f"calls {name}"))
    return arrows


def py_arrows(root):
    """(file, file, why) for every import between modules of python/tpflex."""
    pkg = os.path.join("python", "tpflex")
    mods = {}
    for dirpath, dirs, files in os.walk(os.path.join(root, pkg)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                name = rel[:-3].replace(os.sep, ".").replace("python.", "", 1)
                mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = rel
    arrows = []

    def typing_only(node):
        t = node.test
        return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
            isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")

    for name, rel in mods.items():
        with open(os.path.join(root, rel), encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), rel)
        is_pkg = rel.endswith("__init__.py")
        skip = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and typing_only(node):
                skip.update(id(n) for b in node.body for n in ast.walk(b))
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = name if is_pkg else name.rsplit(".", 1)[0]
                for _ in range(max(node.level - 1, 0)):
                    base = base.rsplit(".", 1)[0]
                mod = node.module or ""
                full = (base + "." + mod if mod else base) if node.level else mod
                targets = [full + "." + a.name for a in node.names if full + "." + a.name in mods]
                if len(targets) < len(node.names) and full in mods:
                    targets.append(full)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name in mods]
            for t in targets:
                if mods[t] != rel:
                    arrows.append((rel, mods[t], f"imports {t}"))
    return arrows


def circles(nodes, edges):
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
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
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


SELF_TEST = {
    # core/a.c calls b.c's function and b.c includes a.h: one circle through a header's name.
    "core/a.h": "int a_f(void);\n",
    "core/a.c": '#include "a.h"\nint b_f(void);\nint a_f(void) { return b_f(); }\n',
    "core/b.c": '#include "a.h"\nint b_f(void) { return 1; }\nint b_g(void) { return a_f(); }\n',
    # A backend including the core's private header: one room-rule violation.
    "core/internal.h": "int internal_f(void);\n",
    "backend_sim/s.c": '#include "internal.h"\nstatic int s_f(void) { return 0; }\n',
    # Two modules importing each other (one inside a function): a second circle; the
    # TYPE_CHECKING import makes no arrow.
    "python/tpflex/__init__.py": "",
    "python/tpflex/p.py": "from . import q, r\n",
    "python/tpflex/q.py": "def f():\n    from .p import g\n",
    "python/tpflex/r.py": ("from typing import TYPE_CHECKING\n"
                           "if TYPE_CHECKING:\n    from . import p\n"),
}


def self_test():
    """The checker on a small tree with two circles and one room violation must fail, naming
    them; the same tree without them must pass."""
    import io
    import tempfile
    from contextlib import redirect_stdout
    with tempfile.TemporaryDirectory() as root:
        for path, text in SELF_TEST.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as fh:
                fh.write(text)
        out = io.StringIO()
        with redirect_stdout(out):
            rc = main([root])
        text = out.getvalue()
        want = ["circle: core/a <-> core/b", "circle: python/tpflex/p <-> python/tpflex/q",
                "room rule: backend_sim/s.c (backend_sim) #include \"internal.h\", a file of core",
                "2 circles, 1 room-rule violations"]
        missing = [w for w in want if w not in text]
        os.remove(os.path.join(root, "core/b.c"))
        os.remove(os.path.join(root, "backend_sim/s.c"))
        os.remove(os.path.join(root, "python/tpflex/q.py"))
        out2 = io.StringIO()
        with redirect_stdout(out2):
            rc2 = main([root])
    print(text + out2.getvalue())
    if rc != 1 or missing or rc2 != 0:
        print(f"self-test FAILED: rc {rc} (want 1), rc {rc2} after the fix (want 0), "
              f"missing {missing}")
        return 1
    print("self-test: OK (two circles and a room violation found; none once removed)")
    return 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    verbose = "-v" in argv
    args = [a for a in argv if a != "-v"]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    files = list(walk(root))
    arrows = c_arrows(root, files) + py_arrows(root)
    edges, why = {}, {}
    for a, b, w in arrows:
        ua, ub = unit_of(a), unit_of(b)
        if ua != ub:
            edges.setdefault(ua, set()).add(ub)
            why.setdefault((ua, ub), []).append(f"{a}: {w}")
    nodes = {unit_of(f) for f in files} | {unit_of(a) for a, _, _ in arrows}
    bad = 0
    for a, b, w in arrows:
        ra, rb = room_of(a), room_of(b)
        if w.startswith("#include") and ra != rb and rb not in ALLOWED.get(ra, set()):
            print(f"room rule: {a} ({ra}) {w}, a file of {rb}; {ra} may include "
                  f"{', '.join(sorted(ALLOWED.get(ra, set()) | {ra}))} (scripts/check_rooms.py "
                  f"ALLOWED, docs/DESIGN.md)")
            bad += 1
    if verbose:
        for (ua, ub), ws in sorted(why.items()):
            print(f"{ua} -> {ub}: {'; '.join(sorted(set(ws))[:4])}")
    found = circles(nodes, edges)
    for comp in found:
        print("circle: " + " <-> ".join(comp))
        members = set(comp)
        for (ua, ub), ws in sorted(why.items()):
            if ua in members and ub in members:
                print(f"  {ua} -> {ub}: {'; '.join(sorted(set(ws))[:3])}")
    print(f"rooms: {len(files)} C files and the Python package, {len(nodes)} units, "
          f"{len(why)} arrows between units; {len(found)} circles, {bad} room-rule violations")
    return 1 if found or bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
