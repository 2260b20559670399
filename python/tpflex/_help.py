"""help() for the public names: their annotations evaluated, not quoted.

The package's modules use ``from __future__ import annotations`` (Python 3.8's typing), so every
annotation is stored as its source text and help() shows ``shape: 'Sequence[int]'``. evaluate()
replaces each such string of a public function, or of every function a public class defines, by
the object it names, in the function's own module (else in the public face's names); one it
cannot evaluate stays a string, and tests/python/test_docs.py names it. Nothing calls the functions
differently: only ``__annotations__`` changes, once, at import.
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, Iterable, Optional


def _functions(obj: Any) -> Iterable[Any]:
    if inspect.isclass(obj):
        for klass in obj.__mro__:
            if not klass.__module__.startswith("tpflex"):
                continue
            for name, member in vars(klass).items():
                if isinstance(member, property):
                    member = member.fget
                elif isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if inspect.isfunction(member):
                    yield member
    elif callable(obj):
        yield inspect.unwrap(obj)


def evaluate(objs: Iterable[Any], names: Optional[Dict[str, Any]] = None) -> None:
    """Evaluates the string annotations of objs (functions and classes) in place, in each
    function's module, else in ``names`` (the public face's, for a name a module imports only
    for type checkers)."""
    for obj in objs:
        for fn in _functions(obj):
            ann = getattr(fn, "__annotations__", None)
            if not ann or not inspect.isfunction(fn):
                continue
            for key, value in list(ann.items()):
                for _ in range(2):  # "'World'": a quoted name under the future import
                    if not isinstance(value, str):
                        break
                    try:
                        value = eval(value, fn.__globals__)  # noqa: S307 (our own source)
                    except NameError:
                        try:
                            value = eval(value, dict(names or {}))  # noqa: S307
                        except Exception:  # not a name anywhere public: left as it was
                            break
                    except Exception:
                        break
                ann[key] = value
