"""The simulator through Python: P ranks as threads of this process.

(Ranks as processes, one simulator rank per torchrun process, need nothing from this module:
``initialize_ub(..., backend="sim")`` or ``TPFLEX_BACKEND=sim`` outside ``run``, SPEC §15. Use
``run`` for quick checks, sweeps, fuzzing and seeded interleavings in one process; torchrun to
run a training script unchanged before it goes to GPUs.)

``run(tp_size, fn, *args)`` creates a world, runs ``fn(rank, *args)`` on each rank's C thread
(a ctypes callback: the thread holds the GIL while Python runs, and every tpflex call releases
it) and returns the results in rank order. When ranks raise, the root cause is raised after
every thread has ended: the first exception in time (a rank that fails before a collective call
makes its peers fail later with TpflexTimeoutError, a consequence); the others are attached to
it in time order as ``exc.peer_errors`` [(rank, exception)] and listed in its notes, and
``exc.tpflex_rank`` is the rank that raised it. A finite ``timeout_ms`` bounds every wait, so
nothing hangs.

``World`` keeps the world (and a state dict per rank, for what code running on the ranks keeps
between runs) across several ``run`` calls. Closing it runs each rank's close hooks (callables
that code put in ``state[ON_CLOSE]``) on the rank's thread and raises their first failure after
the world is gone. The world's memory outlives ``close`` while something holds it
(``keep_alive``: a registration that views still use), so such a view stays readable.

This module imports only _lib, _args and errors (no torch) and knows nothing of the modules that
use it: they keep their per-rank state in ``Rank.state`` and register their own close hooks."""
from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import _lib
from ._args import I32_MAX, U32_MAX, U64_MAX, int_arg
from ._lib import SimConfig, SimStats, check, lib
from .errors import TpflexInvalidError, TpflexStateError, TpflexUnsupportedError

ON_CLOSE = "on_close"  # rank state key: {name: callable()} run on the rank's thread by close()
MAX_RANKS = 64         # tpf_sim_config.tp_size: 1..64

_tls = threading.local()
_SEQ: Iterator[int] = itertools.count()  # the order in which ranks' exceptions were caught


_live = [0]  # worlds created and not yet destroyed


def _note(exc: BaseException, text: str) -> None:
    """exc.add_note(text) (Python >= 3.11: printed with the traceback); on older Pythons the text
    joins exc.__notes__ all the same (the package supports 3.8 on)."""
    if hasattr(exc, "add_note"):
        exc.add_note(text)
    else:
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
            exc.__notes__ = notes  # type: ignore[attr-defined]
        notes.append(text)


def live_worlds() -> int:
    """How many simulator worlds of this process are not destroyed yet (a closed world whose
    memory a view still uses counts until the view dies)."""
    return _live[0]


class _Handle:
    """The tpf_sim_world, destroyed when its last holder lets go (World itself, and whatever
    keep_alive() gave a releaser to)."""

    def __init__(self, h: int) -> None:
        self.h: Optional[int] = h
        self.refs = 1
        self._lock = threading.Lock()
        with self._lock:
            _live[0] += 1

    def retain(self) -> None:
        with self._lock:
            if self.h is None:
                raise TpflexStateError("the simulator world is already destroyed", "tpflex.sim")
            self.refs += 1

    def release(self) -> None:
        with self._lock:
            self.refs -= 1
            if self.refs > 0 or self.h is None:
                return
            h, self.h = self.h, None
            _live[0] -= 1
        check(lib.tpf_sim_world_destroy(h), "tpf_sim_world_destroy")


class RankContext:
    """What a rank thread is bound to during World.run."""

    def __init__(self, world: "World", rank: int, backend: int) -> None:
        self.world = world
        self.rank = rank
        self.backend = backend  # tpf_backend * (as int)

    @property
    def tp_size(self) -> int:
        """The world's rank count P."""
        return self.world.tp_size

    @property
    def state(self) -> Dict[str, Any]:
        """Per-rank state that outlives one run, for the modules that run on the ranks."""
        return self.world._rank_state[self.rank]

    def keep_alive(self) -> Callable[[], None]:
        """Keeps the world's memory (the arena every registration lives in) until the returned
        function is called (once)."""
        return self.world.keep_alive()


def current() -> Optional[RankContext]:
    """The simulator rank the calling thread runs as, or None outside World.run."""
    return getattr(_tls, "ctx", None)


def _root_cause(errors: List[Tuple[int, int, BaseException]]) -> BaseException:
    """The first exception in time, with the others attached (peer_errors, notes)."""
    errors.sort(key=lambda x: x[0])
    _, rank, root = errors[0]
    root.tpflex_rank = rank  # type: ignore[attr-defined]
    others = [(r, e) for _, r, e in errors[1:]]
    root.peer_errors = others  # type: ignore[attr-defined]
    if others:
        _note(root, f"tpflex.sim: raised on rank {rank} first; later, in time order:")
        for r, e in others:
            _note(root, f"  rank {r}: {type(e).__name__}: {e}")
    return root


class World:
    """A simulator world of tp_size ranks (tpf_sim_world_create): ranks are threads of this
    process over one shared arena. ``seed`` and ``max_delay_us`` seed and bound the random step
    delays, ``timeout_ms`` bounds every wait, ``arena_bytes`` sizes the arena (0: the default).
    Use it as a context manager (or call close()); run() may be called many times."""

    def __init__(self, tp_size: int, seed: int = 0, timeout_ms: int = 5000,
                 max_delay_us: int = 0, arena_bytes: int = 0) -> None:
        where = "tpflex.sim.World"
        if not _lib.HAVE_SIM:
            raise TpflexUnsupportedError("the loaded libtpflex has no simulator backend", where)
        P = int_arg(where, "tp_size", tp_size, 1, min(MAX_RANKS, I32_MAX), ctype="int (1..64)")
        cfg = SimConfig(size=ctypes.sizeof(SimConfig), tp_size=P,
                        seed=int_arg(where, "seed", seed, 0, U64_MAX),
                        max_delay_us=int_arg(where, "max_delay_us", max_delay_us, 0, U32_MAX,
                                             ctype="unsigned"),
                        timeout_ms=int_arg(where, "timeout_ms", timeout_ms, 0, U32_MAX,
                                           ctype="unsigned"),
                        arena_bytes=int_arg(where, "arena_bytes", arena_bytes, 0, U64_MAX))
        h = ctypes.c_void_p()
        check(lib.tpf_sim_world_create(ctypes.byref(cfg), ctypes.byref(h)), "tpf_sim_world_create")
        self._handle: Optional[_Handle] = _Handle(h.value)  # type: ignore[arg-type]
        self.tp_size = P
        self.timeout_ms = int(cfg.timeout_ms)
        self._rank_state: List[Dict[str, Any]] = [{} for _ in range(P)]

    @property
    def _h(self) -> Optional[int]:
        return self._handle.h if self._handle is not None else None

    def keep_alive(self) -> Callable[[], None]:
        """Keeps the world's memory until the returned function is called (once)."""
        handle = self._handle
        if handle is None:
            raise TpflexStateError("the simulator world is closed", "tpflex.sim")
        handle.retain()
        done = [False]

        def release() -> None:
            if not done[0]:
                done[0] = True
                handle.release()
        return release

    def run(self, fn: Callable[..., Any], *args: Any) -> List[Any]:
        """Runs fn(rank, *args) on every rank's thread and returns the results in rank order;
        on failure raises the root cause (the first exception in time) with the others attached.
        Not from a rank thread (ranks cannot nest)."""
        if self._handle is None or self._h is None:
            raise TpflexStateError("world already closed", "World.run")
        if current() is not None:
            raise TpflexStateError("World.run called from a simulator rank (ranks cannot nest)",
                                   "World.run")
        P = self.tp_size
        results: List[Any] = [None] * P
        errors: List[Tuple[int, int, BaseException]] = []

        def body(be: int, rank: int, _arg: int) -> int:
            _tls.ctx = RankContext(self, rank, be)
            try:
                results[rank] = fn(rank, *args)
            except BaseException as e:  # re-raised on the caller's thread
                errors.append((next(_SEQ), rank, e))
            finally:
                _tls.ctx = None
            return 0

        cb = _lib.SIM_FN(body)  # kept alive until tpf_sim_run returns
        check(lib.tpf_sim_run(self._h, cb, None), "tpf_sim_run")
        if errors:
            raise _root_cause(errors)
        return results

    def stats(self) -> SimStats:
        """Counters since the world was created (call between runs)."""
        if self._h is None:
            raise TpflexStateError("world already closed", "World.stats")
        s = SimStats()
        check(lib.tpf_sim_get_stats(self._h, ctypes.byref(s)), "tpf_sim_get_stats")
        return s

    def close(self) -> None:
        """Runs every rank's close hooks on its thread, then lets go of the world; raises the
        hooks' root cause, if any, after that."""
        if self._handle is None:
            return
        failure: Optional[BaseException] = None
        if any(st.get(ON_CLOSE) for st in self._rank_state):
            def _hooks(rank: int) -> None:
                hooks = self._rank_state[rank].pop(ON_CLOSE, {})
                first: Optional[BaseException] = None
                for fn in list(hooks.values()):
                    try:
                        fn()
                    except BaseException as e:  # every hook runs; the first failure is raised
                        if first is None:
                            first = e
                if first is not None:
                    raise first
            try:
                self.run(_hooks)
            except BaseException as e:
                failure = e
        handle, self._handle = self._handle, None
        handle.release()
        if failure is not None:
            raise failure

    def __enter__(self) -> "World":
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        try:
            self.close()
        except BaseException as e:
            if exc is None:
                raise
            # The body's exception is the one the caller must see; the teardown's goes with it.
            _note(exc, f"tpflex.sim: closing the world also failed: {type(e).__name__}: {e}")


def run(tp_size: int, fn: Callable[..., Any], *args: Any, seed: int = 0, timeout_ms: int = 5000,
        max_delay_us: int = 0) -> List[Any]:
    """Runs fn(rank, *args) on tp_size simulator ranks; results in rank order; on failure the
    root cause (the first exception in time) with the others attached (see the module doc)."""
    if not callable(fn):
        raise TpflexInvalidError(f"fn={fn!r} is not callable", "tpflex.sim.run")
    with World(tp_size, seed=seed, timeout_ms=timeout_ms, max_delay_us=max_delay_us) as w:
        return w.run(fn, *args)


from . import _help  # noqa: E402 (help() shows the annotations, not their source text)
_help.evaluate([World, RankContext, run, current, live_worlds])
