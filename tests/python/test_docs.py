"""The public Python names document themselves (issue 38 item 5): every public module, every
name it exports (its __all__, else what it defines without a leading underscore), and every
function a public class defines (methods, properties, __call__) has a docstring of its own, and
help() shows their annotations evaluated (`shape: Sequence[int]`), never quoted
(`shape: 'Sequence[int]'`, what `from __future__ import annotations` leaves without
tpflex._help.evaluate). A dataclass's generated docstring (its signature) does not count.
Seconds: imports and inspect only."""
import importlib
import inspect
import pydoc
import unittest
import warnings

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


if __name__ == "__main__":
    unittest.main()
