"""The package around the library: where tpflex finds libtpflex, `python -m tpflex`,
and that the import order of tpflex and torch does not matter.

  test_package.py LIBRARY BACKENDS      (BACKENDS: "sim" or "sim, cuda", what the build has)

1. `python -m tpflex` with TPFLEX_LIBRARY=LIBRARY names that file (the override), the package's
   version and the backends the build compiled in.
2. A copy of the package with LIBRARY bundled as tpflex/lib/libtpflex.so, run from another
   directory with no TPFLEX_LIBRARY, loads the bundled file (what `pip install ./python` makes).
3. The same copy without the bundled file, under the source tree, falls back to the tree's
   build*/libtpflex.so; outside any source tree it does not look for build*/ folders.
4. `import tpflex.torch` before `import torch` works: with a CUDA-enabled library, loading it
   first used to bind libnccl.so.2 to the system's copy and make libtorch_cuda.so fail
   ("undefined symbol: ncclCommResume"). tpflex._lib._needed reads DT_NEEDED right.
Prints "test_package: every check OK" at the end (CTest's pass condition)."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PKG = os.path.join(ROOT, "python", "tpflex")


def run(args, env_extra=None, cwd=None, drop=("TPFLEX_LIBRARY", "PYTHONPATH")):
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_extra or {})
    p = subprocess.run([sys.executable] + args, env=env, cwd=cwd, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


def field(out, key):
    for line in out.splitlines():
        if line.startswith(key + " "):
            return line[len(key):].strip()
    raise AssertionError(f"no '{key}' line in:\n{out}")


def expect(cond, what, out="", err=""):
    if not cond:
        print(f"test_package: FAIL: {what}\n--- stdout\n{out}\n--- stderr\n{err}")
        sys.exit(1)


def main():
    lib, backends = os.path.abspath(sys.argv[1]), sys.argv[2]
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"test_package: FAIL: torch is not importable ({e}); install it for "
              f"{sys.executable} (make pydeps)")
        sys.exit(1)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ["TPFLEX_LIBRARY"] = lib
    from tpflex import __version__
    from tpflex._lib import _needed

    # 0. The source-tree fallback never picks an ASan or TSan build (it cannot be loaded into a
    # plain python3: ASan aborts the process); UBSan and plain builds are fine.
    from tpflex._lib import _sanitized
    with tempfile.TemporaryDirectory() as tmp:
        for value, want in (("address", True), ("address,undefined", True), ("thread", True),
                            ("undefined", False), ("", False)):
            with open(os.path.join(tmp, "CMakeCache.txt"), "w") as f:
                f.write(f"TPF_SANITIZE:STRING={value}\n")
            expect(_sanitized(tmp) == want, f"_sanitized with TPF_SANITIZE={value!r} is not {want}")
        os.remove(os.path.join(tmp, "CMakeCache.txt"))
        expect(not _sanitized(tmp), "_sanitized of a folder without CMakeCache.txt")

    with tempfile.TemporaryDirectory() as tmp:
        # 1. The override.
        rc, out, err = run(["-m", "tpflex"], {"TPFLEX_LIBRARY": lib,
                                             "PYTHONPATH": os.path.join(ROOT, "python")}, cwd=tmp)
        expect(rc == 0, f"python -m tpflex exited {rc}", out, err)
        expect(field(out, "tpflex") == __version__, f"version line is not {__version__}", out, err)
        lpath = field(out, "library")
        expect(os.path.realpath(lpath.split(" (")[0]) == os.path.realpath(lib) and
               "(TPFLEX_LIBRARY)" in lpath, f"library line does not name {lib} (TPFLEX_LIBRARY)",
               out, err)
        expect(field(out, "backends") == backends, f"backends line is not '{backends}'", out, err)
        gpu = field(out, "gpu")
        expect(gpu.startswith(("yes", "no")), "gpu line says neither yes nor no", out, err)
        if "cuda" not in backends:
            expect(gpu.startswith("no: the CUDA backend is not compiled"),
                   "a library without CUDA must say so on the gpu line", out, err)

        # 2. Bundled: a copy of the package as pip installs it, outside the source tree.
        site = os.path.join(tmp, "site")
        shutil.copytree(PKG, os.path.join(site, "tpflex"),
                        ignore=shutil.ignore_patterns("__pycache__", "lib"))
        os.makedirs(os.path.join(site, "tpflex", "lib"))
        bundled = os.path.join(site, "tpflex", "lib", "libtpflex.so")
        shutil.copy2(lib, bundled)
        elsewhere = os.path.join(tmp, "elsewhere")
        os.makedirs(elsewhere)
        rc, out, err = run(["-m", "tpflex"], {"PYTHONPATH": site}, cwd=elsewhere)
        expect(rc == 0, f"bundled: python -m tpflex exited {rc}", out, err)
        expect(field(out, "library") == f"{bundled} (bundled with the package)",
               f"bundled: library line does not name {bundled}", out, err)
        expect(field(out, "backends") == backends, f"bundled: backends line is not '{backends}'",
               out, err)

        # 3. No bundled file: outside a source tree nothing named build*/ is looked at (a decoy
        # there would be picked by a blind glob), so the system's search decides.
        os.remove(bundled)
        decoy = os.path.join(tmp, "build-decoy")
        os.makedirs(decoy)
        with open(os.path.join(decoy, "libtpflex.so"), "wb") as f:
            f.write(b"not a library")
        rc, out, err = run(["-c", "import tpflex._lib as l; print(l.LIBRARY_PATH)"],
                           {"PYTHONPATH": site}, cwd=elsewhere)
        expect(decoy not in out + err, "a build*/ folder outside a source tree was looked at",
               out, err)
        rc, out, err = run(["-c", "import tpflex._lib as l; print(l.LIBRARY_PATH)"],
                           {"PYTHONPATH": os.path.join(ROOT, "python")}, cwd=elsewhere)
        expect(rc == 0, "source tree: import tpflex._lib failed", out, err)
        found = out.strip().splitlines()[-1]
        expect(os.path.dirname(os.path.dirname(found)) == ROOT and
               os.path.basename(os.path.dirname(found)).startswith("build") and
               found.endswith("libtpflex.so"),
               f"source tree: '{found}' is not a build*/libtpflex.so of {ROOT}", out, err)

    # 4. Import order, in fresh interpreters (the library is loaded once per process).
    code = ("import tpflex.torch, torch, tpflex._lib as l\n"
            "x = torch.ones(4, 4) @ torch.ones(4, 4)\n"
            "assert float(x.sum()) == 64.0\n"
            "print('cuda' if l.HAVE_CUDA else 'sim', l.TORCH_IMPORTED_FIRST)\n")
    rc, out, err = run(["-c", code], {"TPFLEX_LIBRARY": lib,
                                      "PYTHONPATH": os.path.join(ROOT, "python")})
    expect(rc == 0, "import tpflex.torch before import torch failed", out, err)
    kind, first = out.split()[-2:]
    expect((kind == "cuda") == ("cuda" in backends), "HAVE_CUDA disagrees with the build", out, err)
    expect(first == ("True" if "cuda" in backends else "False"),
           "torch must be imported first exactly when the library needs CUDA libraries", out, err)
    needed = _needed(lib)
    expect(needed is not None and "libc.so.6" in needed, f"DT_NEEDED of {lib}: {needed}")
    expect(("libnccl.so.2" in needed) == ("cuda" in backends),
           f"DT_NEEDED of {lib} names libnccl.so.2 iff CUDA is built in: {needed}")
    print("test_package: every check OK")


if __name__ == "__main__":
    main()
