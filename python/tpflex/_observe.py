"""Seeing what tpflex does (SPEC §16): profiler ranges, telemetry per communicator, traces.

Profiler ranges. With the switch on, every operation (ag_gemm, gemm_rs, bulk_overlap) and every
shape change (set_ub_active_shape, Communicator.set_active_shape) runs inside a
torch.profiler.record_function range named "tpflex.<op> <site> T=<rows> <algo> splits=<n|auto>",
so torch.profiler's timeline (and its Chrome export) shows tpflex's work beside the model's; on
the CUDA backend the library also opens an NVTX range per operation and shape change (Nsight
Systems), named with the schedule it ran. The switch is off by default (a range costs host time
per call: examples/bench_python_overhead.py prints how much); TPFLEX_PROFILE=1 in the environment
turns it on at import, profile(True) / profile(False) at run time.

Telemetry. The C library counts, per communicator and rank, the operations it accepted, their
rows and the rows a pad-to-capacity run would have run, the bytes moved to and from peers (and
at capacity), and the schedules chosen per power-of-two bucket of T (tpf_comm_get_stats; always
on: a few additions per operation). stats() returns them as a dict per communicator, printing
shows a table; reset_stats() zeroes them. On the CUDA backend with profiling on, the library also
times each operation on the device from CUDA events read lazily (no sync): its span, the union of
its GEMMs, of its communication steps, the exposed time (span minus GEMMs) and the share of the
communication hidden under GEMMs (tpf_cuda_backend_comm_timing); elsewhere those keys are None.

Traces. trace(path) is a context manager writing a Chrome / Perfetto JSON trace (the format of
`tpflex demo --trace`) of what runs inside it: a host span per operation and shape change on the
rank's "host" track, and on the simulator every step of every rank on its stream's track (its
worker threads report them). The simulator's step hook is set between runs only, so trace()
must be entered around tpflex.sim.run / World.run for the steps (entered inside a rank function
it still records the host spans). On CUDA each process writes its own file: path with "{rank}"
formatted, or, under torch.distributed with more than one process, ".rank<r>" before the
extension; host spans only (device spans are not recorded yet).
"""
from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from ctypes import POINTER, Structure, c_int, c_int32, c_size_t, c_uint32, c_uint64, c_void_p
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from . import _lib, sim
from ._lib import check, lib
from ._state import state
from .errors import TpflexError, TpflexInvalidError, TpflexStateError, TpflexUnsupportedError

# ---- the switch ----

_PROFILE = os.environ.get("TPFLEX_PROFILE", "").strip() not in ("", "0")
_tracer: Optional["_Trace"] = None
# What the hooks in _comm.py and _manager.py test (one module attribute per call): profiling
# or a trace is on.
ON = _PROFILE

# The range: torch's low-overhead RecordFunction (what torch.profiler.record_function records,
# without its op dispatch: under 1 µs against tens), or record_function where torch lacks it.
_record_function = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast",
                           torch.profiler.record_function)


def _set_c_profile(on: bool) -> None:
    fn = getattr(lib, "tpf_cuda_set_profile", None)  # a library built with the CUDA backend
    if fn is not None:
        fn.argtypes, fn.restype = [c_int], None
        fn(1 if on else 0)


def _update() -> None:
    global ON
    ON = _PROFILE or _tracer is not None


def profile(enabled: bool = True) -> bool:
    """Turns the profiler ranges on or off (torch.profiler ranges here; NVTX ranges in the CUDA
    backend); returns the previous setting. The environment variable TPFLEX_PROFILE=1 sets the
    initial one."""
    global _PROFILE
    if not isinstance(enabled, bool):
        raise TpflexInvalidError(f"enabled={enabled!r} must be True or False", "tpflex.profile")
    prev, _PROFILE = _PROFILE, enabled
    _set_c_profile(enabled)
    _update()
    return prev


def profiling() -> bool:
    """Whether the profiler ranges are on."""
    return _PROFILE


if _PROFILE:
    _set_c_profile(True)


# ---- the hooks (called only while ON) ----

def _range_name(comm: Any, kind: str, options: Dict[str, Any]) -> str:
    splits = options.get("num_splits") if options else None
    # The C library's active rows (the Python side's copy follows the views, lazily). A destroyed
    # communicator has none: the operation itself raises the error that says so, as when off.
    try:
        T: Any = comm.active_shape[0]
    except TpflexError:
        T = "?"
    return f"tpflex.{kind} {comm.name} T={T} {comm.algo} splits={splits if splits else 'auto'}"


def op(comm: Any, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Runs one operation fn(*args) (its options dict last) inside its range and span."""
    name = _range_name(comm, kind, args[-1])
    tr = _tracer
    t0 = time.perf_counter_ns() if tr is not None else 0
    if _PROFILE:
        with _record_function(name):
            res = fn(*args)
    else:
        res = fn(*args)
    if tr is not None:
        tr.host(comm.rank, name, comm.name, t0, time.perf_counter_ns())
    return res


def shape_change(owner: Any, shape: Any, fn: Callable[..., Any]) -> Any:
    """Runs a shape change fn(owner, shape) (a Manager's or a Communicator's) inside its range."""
    try:
        rows = int(shape[0])
    except Exception:  # the call itself raises the error that names the argument
        rows = -1
    site = getattr(owner, "name", "all sites")
    name = f"tpflex.set_active_shape {site} T={rows}"
    tr = _tracer
    t0 = time.perf_counter_ns() if tr is not None else 0
    if _PROFILE:
        with _record_function(name):
            res = fn(owner, shape)
    else:
        res = fn(owner, shape)
    if tr is not None:
        tr.host(owner.rank, name, "set_active_shape", t0, time.perf_counter_ns())
    return res


# ---- telemetry ----

STATS_BUCKETS = 32


class _SchedStat(Structure):
    _fields_ = [("num_splits", c_int32), ("aggregate", c_int32), ("ops", c_uint64)]


class _Bucket(Structure):
    _fields_ = [("ops", c_uint64), ("rows", c_uint64), ("schedules", _SchedStat * 4),
                ("other_ops", c_uint64)]


class CommStats(Structure):
    """tpf_comm_stats (tpflex.h, Telemetry)."""
    _fields_ = [("size", c_size_t), ("ops", c_uint64), ("rows", c_uint64),
                ("padded_rows", c_uint64), ("bytes", c_uint64), ("padded_bytes", c_uint64),
                ("shape_changes", c_uint64), ("buckets", _Bucket * STATS_BUCKETS)]


class CudaTiming(Structure):
    """tpf_cuda_comm_timing (tpflex_cuda.h): device timing while profiling."""
    _fields_ = [("size", c_size_t), ("timed_ops", c_uint64), ("pending_ops", c_uint64),
                ("untimed_ops", c_uint64), ("op_us", ctypes.c_double),
                ("gemm_us", ctypes.c_double), ("comm_us", ctypes.c_double),
                ("exposed_us", ctypes.c_double), ("hidden_us", ctypes.c_double)]


HAVE_TIMING = hasattr(lib, "tpf_cuda_backend_comm_timing")
if HAVE_TIMING:
    lib.tpf_cuda_backend_comm_timing.argtypes = [c_void_p, ctypes.c_char_p, POINTER(CudaTiming),
                                                 c_int]
    lib.tpf_cuda_backend_comm_timing.restype = c_int

HAVE_STATS = hasattr(lib, "tpf_comm_get_stats")
if HAVE_STATS:
    lib.tpf_comm_get_stats.argtypes = [c_void_p, POINTER(CommStats)]
    lib.tpf_comm_get_stats.restype = c_int
    lib.tpf_comm_reset_stats.argtypes = [c_void_p]
    lib.tpf_comm_reset_stats.restype = c_int


def _need_stats(where: str) -> None:
    if not HAVE_STATS:
        raise TpflexUnsupportedError(f"the loaded libtpflex ({_lib.LIBRARY_PATH}) has no "
                                     "tpf_comm_get_stats: rebuild it from this source tree",
                                     where)


def _bucket_label(b: int) -> str:
    lo = 1 << b
    return f"[{lo}, inf)" if b == STATS_BUCKETS - 1 else f"[{lo}, {lo << 1})"


def _schedule_label(s: _SchedStat, algo: str) -> str:
    if algo == "bulk":  # one schedule, no splits (the C counters file it under 1)
        return "bulk"
    return f"splits {s.num_splits}" + (" aggregate" if s.aggregate else "")


def _timing(backend: Any, name: str, reset: bool) -> Optional[CudaTiming]:
    """The CUDA backend's device timing of site `name` (None: no CUDA backend)."""
    h = getattr(backend, "handle", None) if backend is not None else None
    if not HAVE_TIMING or h is None:
        return None
    t = CudaTiming(size=ctypes.sizeof(CudaTiming))
    check(lib.tpf_cuda_backend_comm_timing(h, name.encode(), ctypes.byref(t), int(reset)),
          f"device timing of '{name}'")
    return t


def _comm_dict(comm: Any, backend: Any = None) -> Dict[str, Any]:
    s = CommStats(size=ctypes.sizeof(CommStats))
    check(lib.tpf_comm_get_stats(comm._handle(), ctypes.byref(s)), f"stats of '{comm.name}'")
    buckets: Dict[str, Any] = {}
    for b in range(STATS_BUCKETS):
        k = s.buckets[b]
        if k.ops:
            chosen = {_schedule_label(x, comm.algo): int(x.ops) for x in k.schedules
                      if x.num_splits}
            buckets[_bucket_label(b)] = {"ops": int(k.ops), "rows": int(k.rows),
                                         "schedules": chosen, "other_ops": int(k.other_ops)}
    return {"algo": comm.algo, "coll": comm.coll, "ops": int(s.ops), "rows": int(s.rows),
            "padded_rows": int(s.padded_rows), "bytes": int(s.bytes),
            "padded_bytes": int(s.padded_bytes), "shape_changes": int(s.shape_changes),
            "schedules": buckets, **_timing_keys(_timing(backend, comm.name, False))}


def _timing_keys(t: Optional[CudaTiming]) -> Dict[str, Any]:
    """exposed_comm_us: per timed operation, its time not covered by its GEMMs; hidden_comm_share:
    the share of its communication that ran under a GEMM. None where nothing was timed (the
    simulator; CUDA with profiling off)."""
    if t is None or not t.timed_ops:
        return {"timed_ops": 0, "exposed_comm_us": None, "hidden_comm_share": None}
    return {"timed_ops": int(t.timed_ops), "pending_ops": int(t.pending_ops),
            "untimed_ops": int(t.untimed_ops), "op_us": t.op_us / t.timed_ops,
            "gemm_us": t.gemm_us / t.timed_ops, "comm_us": t.comm_us / t.timed_ops,
            "exposed_comm_us": t.exposed_us / t.timed_ops,
            "hidden_comm_share": t.hidden_us / t.comm_us if t.comm_us > 0 else None}


def _size(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.1f} {unit}"
    return f"{n} B"


class StatsReport(dict):
    """stats()'s result: {site: counters}; str() (print) is a short table."""

    rank = 0
    backend = "?"

    def table(self) -> str:
        """The counters as a short text table, one row per site (what print() shows)."""
        head = (f"tpflex stats, rank {self.rank} ({self.backend}): since initialize_ub or "
                "reset_stats; 'padded' = every operation at capacity")
        cols = (f"{'site':16s} {'ops':>6s} {'rows':>10s} {'padded rows':>12s} {'saved':>6s} "
                f"{'moved':>10s} {'padded':>10s}  schedules by T bucket (splits: ops)")
        lines = [head, cols]
        idle = [name for name, d in self.items() if not d["ops"]]
        for name, d in self.items():
            if not d["ops"]:
                continue
            saved = (f"{100 * (1 - d['rows'] / d['padded_rows']):5.1f}%"
                     if d["padded_rows"] else f"{'-':>6s}")
            sched = "; ".join(
                f"T{k} " + ", ".join(f"{lab.replace('splits ', 's')}: {n}"
                                     for lab, n in v["schedules"].items())
                + (f", other: {v['other_ops']}" if v["other_ops"] else "")
                for k, v in d["schedules"].items())
            lines.append(f"{name:16s} {d['ops']:6d} {d['rows']:10d} {d['padded_rows']:12d} "
                         f"{saved:>6s} {_size(d['bytes']):>10s} {_size(d['padded_bytes']):>10s}  "
                         f"{sched or '-'}")
        if idle:
            lines.append(f"no operations: {', '.join(idle)}")
        timed = [(n, d) for n, d in self.items() if d.get("exposed_comm_us") is not None]
        for n, d in timed:
            share = d["hidden_comm_share"]
            lines.append(f"{n}: device, per operation ({d['timed_ops']} timed while profiling): "
                         f"{d['op_us']:.1f} us, GEMMs {d['gemm_us']:.1f} us, communication "
                         f"{d['comm_us']:.1f} us, exposed {d['exposed_comm_us']:.1f} us, hidden "
                         + (f"{100 * share:.0f}%" if share is not None else "-"))
        if not timed:
            lines.append("exposed/hidden communication: not measured (CUDA backend with "
                         "profiling on only)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _manager() -> Any:
    """initialize_ub's manager of this rank (_te.current_manager, read from the state directly:
    _te imports the modules whose hooks call this one)."""
    m = state().get("manager")
    if m is None:
        raise TpflexStateError("initialize_ub has not been called on this rank", "tpflex.torch")
    return m


def stats() -> StatsReport:
    """This rank's counters per communicator of initialize_ub's manager: a dict {site: {"ops",
    "rows", "padded_rows", "bytes", "padded_bytes", "shape_changes", "schedules": {"[lo, hi)":
    {"ops", "rows", "schedules": {"splits S[ aggregate]": ops}, "other_ops"}}, "algo", "coll",
    "timed_ops", "exposed_comm_us", "hidden_comm_share"}}: the last two per timed operation on
    the CUDA backend while profiling (then also "op_us", "gemm_us", "comm_us", "pending_ops",
    "untimed_ops"), else None; print() it for a table."""
    _need_stats("tpflex.torch.stats")
    m = _manager()
    be = getattr(m, "_owner", None)
    rep = StatsReport((name, _comm_dict(c, be)) for name, c in m._comms.items())
    rep.rank, rep.backend = m.rank, m.backend
    return rep


def print_stats() -> StatsReport:
    """Prints stats() as a table and returns it."""
    rep = stats()
    print(rep.table())
    return rep


def reset_stats() -> None:
    """Zeroes this rank's counters of every communicator of initialize_ub's manager."""
    _need_stats("tpflex.torch.reset_stats")
    m = _manager()
    for name, c in m._comms.items():
        check(lib.tpf_comm_reset_stats(c._handle()), f"reset_stats of '{name}'")
        _timing(getattr(m, "_owner", None), name, True)


# ---- traces ----

class _SimEvent(Structure):
    """tpf_sim_trace_event (tpflex_sim.h)."""
    _fields_ = [("rank", c_int), ("stream", c_int), ("step", c_int), ("kind", c_int),
                ("peer", c_int), ("chunk", c_int), ("tag", c_uint32), ("comm", ctypes.c_char_p),
                ("seq", c_uint64), ("bytes", c_uint64), ("flops", c_uint64), ("t0_ns", c_uint64),
                ("t1_ns", c_uint64)]


_SIM_TRACE_FN = ctypes.CFUNCTYPE(None, c_void_p, POINTER(_SimEvent))
HOST_TID = 5  # after the streams' tracks (tools/trace.h: TPF_TRACE_HOST_TID)


def _on_sim_event(ctx: Optional[int], evp: Any) -> None:
    tr = _tracer
    if tr is not None:
        e = evp.contents
        tr.steps.append((ctx or 0, e.rank, e.stream, e.kind, e.peer, e.chunk, e.tag,
                         (e.comm or b"").decode(errors="replace"), e.seq, e.bytes, e.t0_ns,
                         e.t1_ns))


_SIM_CB = _SIM_TRACE_FN(_on_sim_event)  # lives as long as the module: never a dangling hook


def _name(fn: Any, arg: int) -> str:
    fn.restype = ctypes.c_char_p
    fn.argtypes = [c_int]
    return (fn(arg) or b"?").decode()


class _Trace:
    def __init__(self, path: str) -> None:
        self.path = path
        self.t0 = time.perf_counter_ns()
        self.spans: List[Tuple[int, str, str, int, int]] = []  # rank, name, cat, t0, t1
        self.steps: List[Tuple[Any, ...]] = []
        self.offsets: List[int] = []  # per world run: trace ns - world ns
        self.max_rank = 0
        self.depth = 1
        self._real_run: Optional[Callable[..., Any]] = None

    def host(self, rank: int, name: str, cat: str, t0: int, t1: int) -> None:
        self.spans.append((rank, name, cat, t0 - self.t0, t1 - self.t0))
        if rank > self.max_rank:
            self.max_rank = rank

    # The simulator's hook is set and cleared between runs: World.run is wrapped for the
    # lifetime of the trace (and restored after it).
    def wrap_sim(self) -> None:
        if not _lib.HAVE_SIM:
            return
        lib.tpf_sim_set_trace.argtypes = [c_void_p, _SIM_TRACE_FN, c_void_p]
        lib.tpf_sim_elapsed_ns.argtypes = [c_void_p]
        lib.tpf_sim_elapsed_ns.restype = c_uint64
        real = self._real_run = sim.World.run
        tr = self

        def run(world: Any, fn: Callable[..., Any], *args: Any) -> Any:
            h = world._h
            if h is None or sim.current() is not None or _tracer is not tr:
                return real(world, fn, *args)  # its own error, or not traced
            idx = len(tr.offsets)
            tr.offsets.append(time.perf_counter_ns() - tr.t0 - int(lib.tpf_sim_elapsed_ns(h)))
            tr.max_rank = max(tr.max_rank, world.tp_size - 1)
            check(lib.tpf_sim_set_trace(h, _SIM_CB, idx), "tpf_sim_set_trace")
            try:
                return real(world, fn, *args)
            finally:
                lib.tpf_sim_set_trace(h, _SIM_TRACE_FN(), None)
        sim.World.run = run  # type: ignore[method-assign]

    def unwrap_sim(self) -> None:
        if self._real_run is not None:
            sim.World.run = self._real_run  # type: ignore[method-assign]
            self._real_run = None

    def events(self) -> List[Dict[str, Any]]:
        ev: List[Dict[str, Any]] = []
        streams = {k: _name(lib.tpf_stream_name, k) for k in range(HOST_TID)}
        for r in range(self.max_rank + 1):
            ev.append({"ph": "M", "name": "process_name", "pid": r,
                       "args": {"name": f"rank {r}"}})
            ev.append({"ph": "M", "name": "process_sort_index", "pid": r,
                       "args": {"sort_index": r}})
            for tid in range(HOST_TID + 1):
                ev.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid,
                           "args": {"name": "host" if tid == HOST_TID else streams[tid]}})
                ev.append({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": tid,
                           "args": {"sort_index": 0 if tid == HOST_TID else tid + 1}})
        for rank, name, cat, t0, t1 in self.spans:
            ev.append({"ph": "X", "pid": rank, "tid": HOST_TID, "ts": t0 / 1000.0,
                       "dur": max(0, t1 - t0) / 1000.0, "name": name, "cat": cat,
                       "args": {"comm": cat}})
        kinds: Dict[int, str] = {}
        for (w, rank, stream, kind, peer, chunk, tag, comm, seq, nbytes, t0, t1) in self.steps:
            k = kinds.get(kind) or kinds.setdefault(kind, _name(lib.tpf_step_kind_name, kind))
            if k == "SEND":
                name = f"{k} c{chunk} -> r{peer}"
            elif k == "RECV":
                name = f"{k} c{chunk} <- r{peer}"
            elif k == "BARRIER":
                name = f"{k} {tag}"
            elif k == "HANDSHAKE":
                name = k
            else:
                name = f"{k} c{chunk}"
            off = self.offsets[w] if w < len(self.offsets) else 0
            ev.append({"ph": "X", "pid": rank, "tid": stream, "ts": (t0 + off) / 1000.0,
                       "dur": max(0, t1 - t0) / 1000.0, "name": name, "cat": comm or "tpflex",
                       "args": {"comm": comm, "seq": seq, "bytes": nbytes}})
        return ev

    def write(self) -> None:
        with open(self.path, "w") as f:
            json.dump({"displayTimeUnit": "ns", "traceEvents": self.events()}, f)
            f.write("\n")


_trace_lock = threading.Lock()


def _trace_path(path: Any) -> str:
    where = "tpflex.torch.trace"
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TpflexInvalidError(f"path={path!r} must be a non-empty file path", where)
    p = os.fspath(path)
    rank = None
    if sim.current() is None and torch.distributed.is_available() and \
            torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        rank = torch.distributed.get_rank()
    if "{rank}" in p:
        p = p.replace("{rank}", str(rank or 0))
    elif rank is not None:
        stem, ext = os.path.splitext(p)
        p = f"{stem}.rank{rank}{ext}"
    d = os.path.dirname(os.path.abspath(p))
    if os.path.isdir(p) or not os.path.isdir(d) or not os.access(d, os.W_OK) or \
            (os.path.exists(p) and not os.access(p, os.W_OK)):
        raise TpflexInvalidError(f"trace file '{p}' cannot be written (a directory, or a folder "
                                 "that does not exist or is not writable): pass a writable path",
                                 where)
    return p


class trace:  # noqa: N801 (a context manager named as TE names its functions)
    """with tpflex.torch.trace("step.json"): ... writes a Chrome / Perfetto JSON trace of what
    ran inside (see the module doc). The path is checked on entry; the file is written on exit,
    also when the body raised. Simulator ranks entering it together share one trace (the last to
    leave writes it); a second, different trace while one is open is refused."""

    def __init__(self, path: Any) -> None:
        self.path = _trace_path(path)
        self._tr: Optional[_Trace] = None

    def __enter__(self) -> "trace":
        global _tracer
        with _trace_lock:
            if _tracer is not None:
                if _tracer.path != self.path or sim.current() is None:
                    raise TpflexStateError(f"a trace to '{_tracer.path}' is already open; "
                                           "leave it before opening another", "tpflex.torch.trace")
                _tracer.depth += 1
                self._tr = _tracer
                return self
            tr = _Trace(self.path)
            if sim.current() is None:
                tr.wrap_sim()
            _tracer = tr
            self._tr = tr
            _update()
        return self

    def __exit__(self, *exc: Any) -> None:
        global _tracer
        tr = self._tr
        if tr is None:
            return
        self._tr = None
        with _trace_lock:
            tr.depth -= 1
            if tr.depth > 0:
                return
            tr.unwrap_sim()
            _tracer = None
            _update()
        tr.write()

    @property
    def spans(self) -> int:
        """Spans recorded so far (host spans and simulator steps)."""
        tr = self._tr
        return 0 if tr is None else len(tr.spans) + len(tr.steps)
