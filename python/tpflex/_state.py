"""Where tpflex.torch keeps its state: the process's (TE's get_ub is module-global, and autograd
runs CUDA backward on a thread of its own), or, inside tpflex.sim.run, the simulator rank's.

It also holds the communicator registry the custom ops resolve (name, key) in: every
Communicator gets a key, unique in the process and never reused, and registers itself in the
registry of the binding that created it, so a simulator rank only ever reaches its own
communicators."""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Dict, Iterator

from . import sim
from .errors import TpflexStateError

process_state: Dict[str, Any] = {}
_KEYS: Iterator[int] = itertools.count(1)


def state() -> Dict[str, Any]:
    ctx = sim.current()
    if ctx is not None:
        return ctx.state
    return process_state


def where_am_i() -> str:
    ctx = sim.current()
    return f"simulator rank {ctx.rank}" if ctx is not None else "this process"


def register_comm(comm: Any) -> int:
    """Gives `comm` its key and registers it (weakly) in the calling binding's registry."""
    key = next(_KEYS)
    state().setdefault("comms", weakref.WeakValueDictionary())[key] = comm
    return key


def resolve(name: str, key: int, where: str) -> Any:
    """The Communicator (name, key) of the calling binding, or TpflexStateError."""
    reg = state().get("comms")
    c = reg.get(int(key)) if reg is not None else None
    if c is None or c.name != name:
        raise TpflexStateError(
            f"no communicator '{name}' with key {key} on {where_am_i()}: a communicator "
            f"resolves only on the simulator rank (thread) or process that created it, until it "
            f"is collected", where)
    return c
