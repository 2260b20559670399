"""The simulator through Python: P ranks as threads of this process.

``run(tp_size, fn, *args)`` creates a world, runs ``fn(rank, *args)`` on each rank's C thread
(a ctypes callback: the thread holds the GIL while Python runs, and every tpflex call releases
it), returns the results in rank order and re-raises the lowest rank's exception after every
thread has ended. A finite ``timeout_ms`` bounds every wait, so a rank that raises before a
collective call makes its peers fail with TpflexTimeoutError instead of hanging.

``World`` keeps the world (and each rank's tpflex.torch state) across several ``run`` calls."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Dict, List, Optional

from . import _lib
from ._lib import SimConfig, SimStats, check, lib
from .errors import TpflexUnsupportedError

_tls = threading.local()


class RankContext:
    """What a rank thread is bound to during World.run."""

    def __init__(self, world: "World", rank: int, backend: int) -> None:
        self.world = world
        self.rank = rank
        self.backend = backend  # tpf_backend * (as int)

    @property
    def tp_size(self) -> int:
        return self.world.tp_size

    @property
    def state(self) -> Dict[str, Any]:
        """Per-rank module state that outlives one run (tpflex.torch keeps its manager here)."""
        return self.world._rank_state[self.rank]


def current() -> Optional[RankContext]:
    """The simulator rank the calling thread runs as, or None outside World.run."""
    return getattr(_tls, "ctx", None)


class World:
    def __init__(self, tp_size: int, seed: int = 0, timeout_ms: int = 5000,
                 max_delay_us: int = 0, arena_bytes: int = 0) -> None:
        if not _lib.HAVE_SIM:
            raise TpflexUnsupportedError("the loaded libtpflex has no simulator backend",
                                         "tpflex.sim")
        cfg = SimConfig(size=ctypes.sizeof(SimConfig), tp_size=tp_size, seed=seed, max_delay_us=max_delay_us,
                        timeout_ms=timeout_ms, arena_bytes=arena_bytes)
        h = ctypes.c_void_p()
        check(lib.tpf_sim_world_create(ctypes.byref(cfg), ctypes.byref(h)), "tpf_sim_world_create")
        self._h: Optional[int] = h.value
        self.tp_size = tp_size
        self.timeout_ms = timeout_ms
        self._rank_state: List[Dict[str, Any]] = [{} for _ in range(tp_size)]

    def run(self, fn: Callable[..., Any], *args: Any) -> List[Any]:
        if self._h is None:
            raise TpflexUnsupportedError("world already destroyed", "World.run")
        P = self.tp_size
        results: List[Any] = [None] * P
        errors: List[Optional[BaseException]] = [None] * P

        def body(be: int, rank: int, _arg: int) -> int:
            _tls.ctx = RankContext(self, rank, be)
            try:
                results[rank] = fn(rank, *args)
            except BaseException as e:  # re-raised on the caller's thread
                errors[rank] = e
            finally:
                _tls.ctx = None
            return 0

        cb = _lib.SIM_FN(body)  # kept alive until tpf_sim_run returns
        check(lib.tpf_sim_run(self._h, cb, None), "tpf_sim_run")
        for e in errors:
            if e is not None:
                raise e
        return results

    def stats(self) -> SimStats:
        """Counters since the world was created (call between runs)."""
        s = SimStats()
        check(lib.tpf_sim_get_stats(self._h, ctypes.byref(s)), "tpf_sim_get_stats")
        return s

    def close(self) -> None:
        if self._h is None:
            return
        # Destroy what tpflex.torch still holds, on each rank's own thread.
        if any(st.get("manager") is not None for st in self._rank_state):
            def _cleanup(rank: int) -> None:
                from . import torch as _t  # noqa: WPS433 (lazy: torch is optional)
                _t.destroy_ub()
            try:
                self.run(_cleanup)
            except Exception:
                pass
        h, self._h = self._h, None
        check(lib.tpf_sim_world_destroy(h), "tpf_sim_world_destroy")

    def __enter__(self) -> "World":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run(tp_size: int, fn: Callable[..., Any], *args: Any, seed: int = 0, timeout_ms: int = 5000,
        max_delay_us: int = 0) -> List[Any]:
    """Runs fn(rank, *args) on tp_size simulator ranks; results in rank order."""
    with World(tp_size, seed=seed, timeout_ms=timeout_ms, max_delay_us=max_delay_us) as w:
        return w.run(fn, *args)
