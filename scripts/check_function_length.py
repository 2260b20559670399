#!/usr/bin/env python3
"""Lists the C functions longer than a limit (default 80 lines) in the given files or folders.

Usage: check_function_length.py [--max N] PATH...   (a folder: its *.c files, not recursive)
       check_function_length.py --self-test        (the scan on built-in samples; CTest runs it)

A function is a top-level brace block (depth 0 -> 1) whose opening brace follows a ')' (so
struct, enum, union and initialiser blocks are not functions); its length counts the lines from
the line holding its name to the closing brace, both included. Comments, string and character
literals are blanked before the braces are matched. Exit status: 0 when none is longer, 1 when
some are (each printed as path:line: name: N lines), 2 on a usage error or an unreadable file.
"""
import os
import re
import sys


def blank(text):
    """text with comments, string and character literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
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
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + c if j - i >= 2 else text[i:j])
            i = j
        elif c == "#" and (i == 0 or text[i - 1] == "\n"):
            # a preprocessor line (and its continuations): no braces of a macro body count
            j = i
            while True:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                    break
                if text[k - 1] != "\\":
                    break
                j = k + 1
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """Yields (name, first_line, length) of each function of a C source text."""
    s = blank(text)
    depth = 0
    start = None
    for i, c in enumerate(s):
        if c == "{":
            if depth == 0:
                head = s[:i].rstrip()
                if head.endswith(")"):
                    # the name: the identifier before the parameter list's opening parenthesis
                    k, d = len(head) - 1, 0
                    while k >= 0:
                        d += head[k] == ")"
                        d -= head[k] == "("
                        if d == 0:
                            break
                        k -= 1
                    m = re.search(r"([A-Za-z_]\w*)\s*$", head[:k])
                    if m:
                        start = (m.group(1), s.count("\n", 0, m.start(1)) + 1)
                    else:
                        start = None
                else:
                    start = None
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and start:
                last = s.count("\n", 0, i) + 1
                yield start[0], start[1], last - start[1] + 1
                start = None


def sources(paths):
    for p in paths:
        if os.path.isdir(p):
            for f in sorted(os.listdir(p)):
                if f.endswith(".c"):
                    yield os.path.join(p, f)
        else:
            yield p


def self_test():
    """The scan on samples whose answer is known: 0 when every one is right, else 1."""
    body = lambda n: "".join("  x++;\n" for _ in range(n))
    cases = [
        # (source, expected [(name, first line, length)])
        ("int f(void) {\n" + body(78) + "}\n", [("f", 1, 80)]),
        ("static int\ng(int a,\n  int b) {\n" + body(79) + "}\n", [("g", 2, 82)]),
        # braces in comments, strings, characters and macros are not code
        ("/* { */\nint h(void) { // }\n  const char *s = \"}{\"; char c = '}';\n"
         "#define M {\n  return 0;\n}\n", [("h", 2, 5)]),
        # initialisers and type definitions are not functions
        ("static const int t[] = {1, 2};\nstruct s { int a; };\n"
         "enum e { A, B };\nint k(void) { return t[0]; }\n", [("k", 4, 1)]),
        # nested blocks belong to their function
        ("void m(void) {\n  if (1) {\n    for (;;) {\n    }\n  }\n}\n", [("m", 1, 6)]),
    ]
    bad = 0
    for i, (src, want) in enumerate(cases):
        got = list(functions(src))
        if got != want:
            print(f"self-test case {i}: got {got}, expected {want}")
            bad += 1
    long_src = "int f(void) {\n" + body(79) + "}\n"  # 81 lines: over the limit
    if [n for n, _, l in functions(long_src) if l > 80] != ["f"]:
        print("self-test: an 81-line function is not reported")
        bad += 1
    print("check_function_length self-test: " + ("FAILED" if bad else "all cases right"))
    return 1 if bad else 0


def main(argv):
    limit = 80
    args = argv[1:]
    if args == ["--self-test"]:
        return self_test()
    if len(args) >= 2 and args[0] == "--max":
        try:
            limit = int(args[1])
        except ValueError:
            print(f"check_function_length: --max '{args[1]}' is not a number", file=sys.stderr)
            return 2
        args = args[2:]
    if not args:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    long_ones = 0
    for path in sources(args):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            print(f"check_function_length: cannot read {path}: {e}", file=sys.stderr)
            return 2
        for name, line, length in functions(text):
            if length > limit:
                print(f"{path}:{line}: {name}: {length} lines (more than {limit})")
                long_ones += 1
    if long_ones:
        print(f"check_function_length: {long_ones} function(s) longer than {limit} lines")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
