"""The public Python names document themselves (issue 38 item 5): every public module, every
name it exports (its __all__, else what it defines without a leading underscore), and every
function a public class defines (methods, properties, __call__) has a docstring of its own, and
help() shows their annotations evaluated (`shape: Sequence[int]`), never quoted
(`shape: 'Sequence[int]'`, what `from __future__ import annotations` leaves without
tpflex._help.evaluate). A dataclass's generated docstring (its signature) does not count.
And the docs are a map of the tree: every top-level folder is in README.md's layout table, every
file of the C rooms is named in docs/DESIGN.md (a header with its source file; `demo_*.c` names
a family; backend_cuda/ in cuda_backend.c's header, which DESIGN.md points to), every module of
python/tpflex in python/README.md or DESIGN.md; docs/SPEC.md §12's module signatures are the
modules' own. Seconds: imports, inspect and text only."""
import fnmatch
import glob
import importlib
import inspect
import os
import pydoc
import re
import subprocess
import unittest
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

MODULES = ["tpflex", "tpflex.errors", "tpflex.sim", "tpflex.common", "tpflex.common.recipe",
           "tpflex.torch", "tpflex.torch.module", "tpflex.torch.module.base",
           "tpflex.torch.attention", "tpflex.torch.quantization", "tpflex.torch.fp8"]


def _public(mod):
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n, v in vars(mod).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == mod.__name__]
    return names


def _own_doc(obj):
    doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
    doc = (doc or "").strip()
    if inspect.isclass(obj) and doc.startswith(obj.__name__ + "("):
        return ""  # the dataclass decorator's signature, not a description
    return doc


def _members(cls):
    """(qualified name, function) of every function a tpflex class of cls's MRO defines."""
    for klass in cls.__mro__:
        if not klass.__module__.startswith("tpflex"):
            continue
        for name, member in vars(klass).items():
            if isinstance(member, property):
                member = member.fget
            elif isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member):
                yield f"{klass.__name__}.{name}", name, member


def _objects():
    """(where, object) of every public callable, once per object."""
    seen = set()
    for mn in MODULES:
        mod = importlib.import_module(mn)
        for n in _public(mod):
            obj = getattr(mod, n)
            if inspect.ismodule(obj) or not callable(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            yield f"{mn}.{n}", obj


class Docs(unittest.TestCase):
    def test_modules_have_docstrings(self):
        bare = [mn for mn in MODULES if not (importlib.import_module(mn).__doc__ or "").strip()]
        self.assertEqual(bare, [], "public modules without a docstring")

    def test_public_names_have_docstrings(self):
        bare = []
        for where, obj in _objects():
            if not _own_doc(obj):
                bare.append(where)
            if inspect.isclass(obj):
                for qual, name, fn in _members(obj):
                    public = not name.startswith("_") or name == "__call__"
                    if public and not (fn.__doc__ or "").strip():
                        bare.append(f"{where} ({qual})")
        self.assertEqual(sorted(set(bare)), [], "public names without a docstring")

    def test_help_shows_no_quoted_annotations(self):
        quoted = []
        for where, obj in _objects():
            fns = [(where, inspect.unwrap(obj))] if not inspect.isclass(obj) else \
                [(f"{where} ({q})", fn) for q, _, fn in _members(obj)]
            for w, fn in fns:
                if not inspect.isfunction(fn):
                    continue
                sig = inspect.signature(fn)
                texts = [p.annotation for p in sig.parameters.values()] + [sig.return_annotation]
                bad = [t for t in texts if isinstance(t, str)]
                if bad:
                    quoted.append(f"{w}: {bad}")
        self.assertEqual(quoted, [], "help() would show these annotations quoted")

    def test_help_renders(self):
        # pydoc renders every public object without raising, and the text holds its docstring.
        for where, obj in _objects():
            text = pydoc.render_doc(obj, renderer=pydoc.plaintext)
            first = _own_doc(obj).splitlines()[0].strip() if _own_doc(obj) else ""
            self.assertIn(first, text, where)


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def _names(text):
    """The file names and patterns a text puts in backticks (`core/layout.c`, `demo_*.c`)."""
    out = set()
    for tok in re.findall(r"`([^`]+)`", text):
        for w in re.split(r"[\s,()]+", tok):
            if w:
                out.add(os.path.basename(w.rstrip("/")))
    return out


def _named(names, path):
    base = os.path.basename(path)
    stem, ext = os.path.splitext(base)
    if ext == ".h" and stem + ".c" in names:   # a header belongs to the source file of its name
        return True
    return base in names or any(re.fullmatch(r"\w+\*[\w*]*\.\w+", n) and fnmatch.fnmatch(base, n)
                                for n in names)   # a family: `demo_*.c`, `bench_host*.c`


def _top_folders():
    """The top-level folders git tracks (a checkout's own build*/, venv/ and logs are not the
    tree's); without git (an archive of the tree), every folder but those."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True,
                             timeout=60)
        if out.returncode == 0 and out.stdout:
            return sorted({line.split("/")[0] for line in out.stdout.splitlines() if "/" in line
                           and not line.startswith(".")})
    except (OSError, subprocess.SubprocessError):
        pass
    return [d for d in sorted(os.listdir(ROOT)) if os.path.isdir(os.path.join(ROOT, d))
            and not d.startswith((".", "build")) and d not in ("venv", "gpu-logs")]


class Map(unittest.TestCase):
    def test_readme_names_every_top_level_folder(self):
        readme = _read("README.md")
        layout = readme[readme.index("## Layout"):]
        folders = _top_folders()
        missing = [d for d in folders if f"| `{d}/" not in layout]
        self.assertEqual(missing, [], "top-level folders missing from README.md's Layout table")

    def test_design_names_every_file(self):
        design = _names(_read("docs/DESIGN.md"))
        cuda_head = _read("backend_cuda/cuda_backend.c")
        cuda_head = _names("`" + "` `".join(re.findall(r"cuda_\w+\.(?:cu|c|h)",
                                                         cuda_head[:cuda_head.index("*/")])) + "`")
        missing = []
        for room in ("core", "backend_sim", "backend_cuda", "harness", "tools", "tools/bench",
                     "include/tpflex", "scripts"):
            names = design | cuda_head if room == "backend_cuda" else design
            for f in sorted(os.listdir(os.path.join(ROOT, room))):
                path = os.path.join(ROOT, room, f)
                if os.path.isfile(path) and f not in ("CMakeLists.txt", "README.md") \
                        and not _named(names, path):
                    missing.append(f"{room}/{f}")
        self.assertEqual(missing, [], "files docs/DESIGN.md's map does not name")

    def test_python_readme_names_every_module(self):
        names = _names(_read("python/README.md")) | _names(_read("docs/DESIGN.md"))
        pkg = os.path.join(ROOT, "python", "tpflex")
        files = sorted(glob.glob(os.path.join(pkg, "**", "*.py"), recursive=True))
        missing = [os.path.relpath(p, pkg) for p in files
                   if os.path.basename(p) != "__init__.py" and not _named(names, p)]
        self.assertEqual(missing, [], "python/tpflex modules neither python/README.md nor "
                                      "docs/DESIGN.md names")


class Spec(unittest.TestCase):
    def test_spec_signatures_are_the_modules(self):
        """docs/SPEC.md §12's signatures of Linear and LayerNormMLP are the modules' own: names in
        TE's positional order, defaults equal."""
        import ast
        import tpflex.torch as te
        spec = _read("docs/SPEC.md")
        for cls in (te.Linear, te.LayerNormMLP):
            m = re.search(r"`tpflex\.torch\.%s\(([^`]*)\)`" % cls.__name__, spec)
            self.assertIsNotNone(m, f"SPEC §12 has no signature of {cls.__name__}")
            text = " ".join(m.group(1).split())
            self.assertNotIn("*", text, f"SPEC §12's {cls.__name__} has a keyword-only marker; "
                                        f"TE's order has none")
            call = ast.parse(f"f({text})", mode="eval").body
            doc = [(a.id, inspect.Parameter.empty) for a in call.args] + \
                [(k.arg, ast.literal_eval(k.value)) for k in call.keywords]
            params = list(inspect.signature(cls.__init__).parameters.values())[1:]
            self.assertEqual(doc, [(p.name, p.default) for p in params], cls.__name__)


if __name__ == "__main__":
    unittest.main()
