"""The bootstrap over torch.distributed: tpf_bootstrap's allgather and barrier as ctypes
callbacks over a gloo process group, the tpf_backends they serve (the CUDA backend, and the
simulator with ranks as processes under torchrun), and the agreement of the ranks'
initialize_ub arguments before anything is registered."""
from __future__ import annotations

import ctypes
import datetime
import os
import pickle
from typing import Any, List, Optional, Tuple

import torch

from . import _lib
from ._lib import BOOT_ALLGATHER_FN, BOOT_BARRIER_FN, Bootstrap, check, lib
from ._state import process_state
from ._types import TPF_EBACKEND, TPF_ETIMEOUT
from .errors import TpflexMismatchError, TpflexTimeoutError


def boot_timeout_ms() -> int:
    try:
        return max(1, int(os.environ.get("TPF_CUDA_BOOT_TIMEOUT_MS", "120000")))
    except ValueError:
        return 120000


def gloo_group(group: Any) -> Any:
    """A process group over the same ranks that moves CPU tensors with gloo: `group` itself
    when its backend has gloo (gloo, or the default "cpu:gloo,cuda:nccl"), else a twin created
    once per group (every member calls initialize_ub, so the creation is collective)."""
    import torch.distributed as dist
    g = group if group is not None else dist.group.WORLD
    if "gloo" in str(dist.get_backend(g)):
        return g
    cache = process_state.setdefault("gloo_twins", {})
    key = id(g)
    if key not in cache:
        timeout = datetime.timedelta(milliseconds=boot_timeout_ms())
        if group is None or g == dist.group.WORLD:
            cache[key] = dist.new_group(backend="gloo", timeout=timeout)
        else:
            cache[key] = dist.new_group(ranks=dist.get_process_group_ranks(g), backend="gloo",
                                        timeout=timeout, use_local_synchronization=True)
    return cache[key]


class GlooBootstrap:
    """tpf_bootstrap's allgather and barrier as ctypes callbacks over a gloo process group (CPU
    tensors), each bounded by TPF_CUDA_BOOT_TIMEOUT_MS (default 120 s). C calls them on the
    thread that called into tpflex (backend and communicator creation, destroy); a failure
    returns TPF_ETIMEOUT / TPF_EBACKEND with the detail in tpf_last_error()."""

    def __init__(self, group: Any, timeout_ms: Optional[int] = None) -> None:
        import torch.distributed as dist
        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.timeout_ms = timeout_ms or boot_timeout_ms()
        self.calls = 0
        self._ag = BOOT_ALLGATHER_FN(self._allgather_cb)
        self._bar = BOOT_BARRIER_FN(self._barrier_cb)

    def struct(self, device: int) -> Bootstrap:
        """The C tpf_bootstrap for this rank on CUDA device ``device``, its callbacks bound to
        this object (keep the object alive while the backend uses it)."""
        return Bootstrap(tp_size=self.size, rank=self.rank, device=device, allgather=self._ag,
                         barrier=self._bar, ctx=None)

    def allgather(self, data: bytes) -> List[bytes]:
        """Every rank contributes len(data) bytes (the same on every rank); rank order."""
        n = len(data)
        self.calls += 1
        src = torch.frombuffer(bytearray(data), dtype=torch.uint8) if n else \
            torch.empty(0, dtype=torch.uint8)
        outs = [torch.empty(n, dtype=torch.uint8) for _ in range(self.size)]
        work = self._dist.all_gather(outs, src, group=self.group, async_op=True)
        try:
            done = work.wait(timeout=datetime.timedelta(milliseconds=self.timeout_ms))
        except RuntimeError as e:
            raise TpflexTimeoutError(
                f"bootstrap allgather of {n} bytes over gloo (rank {self.rank} of {self.size}) "
                f"did not complete within {self.timeout_ms} ms (TPF_CUDA_BOOT_TIMEOUT_MS): {e}",
                "bootstrap") from None
        if done is False:
            raise TpflexTimeoutError(f"bootstrap allgather of {n} bytes did not complete within "
                                     f"{self.timeout_ms} ms", "bootstrap")
        return [ctypes.string_at(t.data_ptr(), n) if n else b"" for t in outs]

    def allgather_varlen(self, data: bytes) -> List[bytes]:
        """Every rank's ``data`` in rank order, the lengths free to differ between ranks."""
        lens = self.allgather(len(data).to_bytes(8, "little"))
        width = max(int.from_bytes(x, "little") for x in lens)
        parts = self.allgather(data.ljust(width, b"\0"))
        return [p[:int.from_bytes(n, "little")] for p, n in zip(parts, lens)]

    def allgather_object(self, obj: Any) -> List[Any]:
        """Every rank's picklable `obj`, in rank order (no numpy needed, unlike
        torch.distributed.all_gather_object)."""
        return [pickle.loads(b) for b in self.allgather_varlen(pickle.dumps(obj))]

    def _allgather_cb(self, _ctx: Any, send: int, recv: int, nbytes: int) -> int:
        try:
            parts = self.allgather(ctypes.string_at(send, nbytes) if nbytes else b"")
            for q, part in enumerate(parts):
                if len(part) != nbytes:
                    return _lib.set_error(TPF_EBACKEND, f"bootstrap allgather: rank {q} sent "
                                          f"{len(part)} bytes, expected {nbytes}")
                ctypes.memmove(recv + q * nbytes, part, nbytes)
            return 0
        except TpflexTimeoutError as e:
            return _lib.set_error(TPF_ETIMEOUT, e.detail)
        except BaseException as e:  # never let an exception cross the C frame
            return _lib.set_error(TPF_EBACKEND, f"bootstrap allgather over gloo failed on rank "
                                  f"{self.rank}: {type(e).__name__}: {e}")

    def _barrier_cb(self, _ctx: Any) -> int:
        try:
            self.allgather(b"\1")
            return 0
        except TpflexTimeoutError as e:
            return _lib.set_error(TPF_ETIMEOUT, e.detail.replace("allgather of 1 bytes",
                                                                 "barrier"))
        except BaseException as e:
            return _lib.set_error(TPF_EBACKEND, f"bootstrap barrier over gloo failed on rank "
                                  f"{self.rank}: {type(e).__name__}: {e}")


class CudaBackend:
    """A tpf_backend of the CUDA backend with the bootstrap it keeps calling (alive until
    destroy)."""

    def __init__(self, boot: GlooBootstrap, device: torch.device,
                 timeout_ms: Optional[int]) -> None:
        self.boot = boot
        self.device = device
        self._boot_struct = boot.struct(int(device.index))
        h = ctypes.c_void_p()
        check(lib.tpf_cuda_backend_create(ctypes.byref(self._boot_struct), ctypes.byref(h)),
              "tpf_cuda_backend_create")
        self.handle: Optional[int] = h.value
        if timeout_ms is not None:
            try:
                check(lib.tpf_cuda_backend_set_timeout(self.handle, int(timeout_ms)),
                      "tpf_cuda_backend_set_timeout")
            except BaseException:
                self.destroy()
                raise

    def destroy(self) -> None:
        if self.handle is not None:
            h, self.handle = self.handle, None
            check(lib.tpf_cuda_backend_destroy(h), "tpf_cuda_backend_destroy")


def _decl_sim_procs() -> bool:
    """Declares the simulator's process-mode entry points (tpflex_sim.h, 0.3) when the loaded
    library has them."""
    if not hasattr(lib, "tpf_sim_backend_create"):
        return False
    _lib._decl("tpf_sim_backend_create", ctypes.c_int, ctypes.POINTER(_lib.SimConfig),
               ctypes.POINTER(Bootstrap), ctypes.POINTER(ctypes.c_void_p))
    _lib._decl("tpf_sim_backend_destroy", ctypes.c_int, ctypes.c_void_p)
    _lib._decl("tpf_sim_backend_world", ctypes.c_int, ctypes.c_void_p,
               ctypes.POINTER(ctypes.c_void_p))
    _lib._decl("tpf_sim_set_timeout", ctypes.c_int, ctypes.c_void_p, ctypes.c_uint)
    return True


HAVE_SIM_PROCS = _decl_sim_procs()


class SimProcsBackend:
    """This process's rank of a simulator group of ranks as processes (tpf_sim_backend_create):
    created over the gloo bootstrap of the script's process group (torchrun), registrations in
    POSIX shared memory; the bootstrap stays alive until destroy (every communicator creation
    calls it). timeout_ms bounds every wait for a peer (default 10000 ms, the simulator's)."""

    kind = "sim"

    def __init__(self, boot: GlooBootstrap, timeout_ms: Optional[int]) -> None:
        self.boot = boot
        self._boot_struct = boot.struct(0)
        cfg = _lib.SimConfig(size=ctypes.sizeof(_lib.SimConfig), tp_size=boot.size, seed=0,
                             max_delay_us=0, timeout_ms=int(timeout_ms or 0), arena_bytes=0)
        h = ctypes.c_void_p()
        check(lib.tpf_sim_backend_create(ctypes.byref(cfg), ctypes.byref(self._boot_struct),
                                         ctypes.byref(h)), "tpf_sim_backend_create")
        self.handle: Optional[int] = h.value

    def destroy(self) -> None:
        if self.handle is not None:
            h, self.handle = self.handle, None
            check(lib.tpf_sim_backend_destroy(h), "tpf_sim_backend_destroy")


def agree(boot: GlooBootstrap, desc: List[Tuple[str, Any]]) -> None:
    """Compares this rank's initialize_ub arguments with every rank's over the bootstrap group
    before anything is registered: TpflexMismatchError on every rank naming the first differing
    field and both values (the C library's creation fingerprint, for backends that lack it)."""
    alls = boot.allgather_object(desc)
    base = alls[0]
    for q, other in enumerate(alls[1:], 1):
        if other == base:
            continue
        for (k0, v0), (k1, v1) in zip(base, other):
            if k0 != k1 or v0 != v1:
                field = k0 if k0 == k1 else f"{k0} / {k1}"
                raise TpflexMismatchError(
                    f"configuration differs between ranks: {field} is {v0!r} on rank 0, {v1!r} "
                    f"on rank {q} (initialize_ub; nothing was registered)", "initialize_ub")
        raise TpflexMismatchError(
            f"configuration differs between ranks: {len(base)} fields on rank 0, {len(other)} on "
            f"rank {q} (initialize_ub; nothing was registered)", "initialize_ub")
