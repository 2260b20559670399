"""Communicators by site name, their checks, and the GEMMs and collectives of the plain path."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as Fn

from .. import _te, sim
from ..errors import (TpflexDivisibleError, TpflexError, TpflexInvalidError, TpflexShapeError,
                      TpflexStateError)

def _tt() -> Any:
    """initialize_ub's module (get_ub, set_ub_active_shape, DEFAULT_UB_CFGS): tpflex._te, not the
    tpflex.torch facade, which imports this package (scripts/check_rooms.py: no circle)."""
    return _te


def _site_names() -> List[str]:
    """TE's site names, in initialize_ub's registration order."""
    return list(_te.DEFAULT_UB_CFGS)


def _get(name: str) -> Any:
    return _tt().get_ub(name)


def _find(prefer: Sequence[str], algo: Optional[str], coll: str) -> Any:
    """The first registered, non-external communicator of kind (algo, coll) among `prefer`, then
    TE's sites; None when there is none."""
    seen = set()
    for n in list(prefer) + _site_names():
        if n in seen:
            continue
        seen.add(n)
        try:
            c = _get(n)
        except TpflexStateError:
            raise
        except TpflexError:
            continue
        if getattr(c, "external", False):
            continue
        if c.coll == coll and (algo is None or c.algo == algo):
            return c
    return None


def _kind(c: Any) -> str:
    return f"{c.algo.upper()} {c.coll.upper()}{' (external)' if getattr(c, 'external', False) else ''}"


def _need(where: str, name: str, flag: str, algos: Tuple[str, ...], coll: str) -> None:
    """Checks that communicator `name` exists and has a kind the flag's operation runs on."""
    tt = _tt()
    try:
        c = tt.get_ub(name)
    except TpflexStateError as e:
        raise TpflexStateError(f"{flag} needs initialize_ub() before the layer is built "
                               f"({e.detail})", where) from None
    except TpflexError as e:
        raise TpflexInvalidError(f"{flag} needs the communicator '{name}' ({e.detail})",
                                 where) from None
    if c.coll != coll or c.algo not in algos or getattr(c, "external", False):
        want = " or ".join(f"{a.upper()} {coll.upper()}" for a in algos)
        raise TpflexInvalidError(f"{flag} runs on '{name}' as {want}, but '{name}' is registered "
                                 f"as {_kind(c)} (change it with initialize_ub's ub_cfgs)", where)


# ---- GEMMs and collectives of the plain path ----------------------------------------------------

def _native(t: torch.Tensor) -> bool:
    """torch's own kernels round as the C epilogue does (fp32 accumulation, the bias added
    before the one rounding) on CUDA in every dtype, and anywhere in fp32. CPU 16-bit kernels
    are not relied on: that path computes in fp32 explicitly and rounds once."""
    return t.is_cuda or t.dtype == torch.float32


def _mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """a @ b with fp32 accumulation, rounded once to out_dtype."""
    if out_dtype == a.dtype and _native(a):
        return a @ b
    if a.is_cuda:
        try:
            return torch.mm(a, b, out_dtype=out_dtype)
        except (RuntimeError, TypeError):
            pass
    return (a.float() @ b.float()).to(out_dtype)


def _linear(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    """x w^T (+ b): fp32 accumulation, the bias added before the one rounding (as the C
    epilogue)."""
    if _native(x):
        return Fn.linear(x, w, b)
    y = x.float() @ w.float().t()
    if b is not None:
        y = y + b.float()
    return y.to(x.dtype)


def _add_bias(y: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y + b in fp32, rounded once (torch's elementwise kernel on CUDA and in fp32)."""
    if _native(y):
        return y + b
    return (y.float() + b.float()).to(y.dtype)


def _bias_grad(dy: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """The column sums of dy in fp32, rounded once to dt (torch's reduction accumulates 16-bit
    inputs in fp32 on CUDA: one kernel, no fp32 copy)."""
    if dy.dtype == dt and _native(dy):
        return dy.sum(0)
    return dy.sum(0, dtype=torch.float32).to(dt)


def _wgrad_into(dy: torch.Tensor, xt: torch.Tensor, w: torch.Tensor, call: "_Call") -> Any:
    """dW = dy^T xt: into w.main_grad (fp32, accumulated) with fuse_wgrad_accumulation (returns
    None), else returned in w's dtype."""
    if call.fuse_wgrad:
        mg = call.main_grad
        if dy.dtype == torch.float32:   # one GEMM into main_grad (beta 1, or 0 to overwrite)
            if call.accumulate:
                mg.addmm_(dy.t(), xt)
            else:
                torch.mm(dy.t(), xt, out=mg)
            return None
        g = _mm(dy.t(), xt, torch.float32)
        if call.accumulate:
            mg.add_(g)
        else:
            mg.copy_(g)
        return None
    return _mm(dy.t(), xt, w.dtype)


class _Plain:
    """AG / RS / AR along the rows of the plain (ub-flag-less) path: torch.distributed over the
    group, as on GPU also for the simulator with ranks as processes (torchrun, gloo: SPEC §15);
    only inside tpflex.sim.run (ranks as threads, no process group) the BULK communicators with
    an empty GEMM beside."""

    def __init__(self, where: str, P: int, group: Any, prefer_ag: Sequence[str],
                 prefer_rs: Sequence[str]) -> None:
        self.where, self.P, self.group = where, P, group
        self.prefer_ag, self.prefer_rs = tuple(prefer_ag), tuple(prefer_rs)
        self.on_sim = sim.current() is not None and group is None
        self._comms: dict = {}   # coll -> its communicator (this object lives per registration)
        if P > 1 and not self.on_sim:
            import torch.distributed as dist
            if not (dist.is_available() and dist.is_initialized()):
                raise TpflexStateError(
                    f"tp_size {P} without a ub flag communicates over torch.distributed: "
                    f"initialise it and pass tp_group (or run on the simulator)", where)

    def _comm(self, coll: str) -> Any:
        c = self._comms.get(coll)
        if c is not None:
            return c
        c = _find(self.prefer_ag if coll == "ag" else self.prefer_rs, "bulk", coll)
        if c is None:
            raise TpflexStateError(
                f"the plain path at tp_size {self.P} on the simulator needs a registered BULK "
                f"{coll.upper()} communicator (initialize_ub registers TE's; none found)",
                self.where)
        self._comms[coll] = c
        return c

    @staticmethod
    def _empty_gemm(c: Any) -> None:
        z = torch.zeros(1, 1, dtype=c.dtype, device=c.device)
        c.bulk_overlap(z, z)

    def _check(self, c: Any, rows: int, cols: int, what: str) -> None:
        T, H = c.active_shape
        if rows != T or cols != H:
            raise TpflexShapeError(
                f"{what} is [{rows}, {cols}] in tokens, but '{c.name}' (the plain path's "
                f"{c.coll.upper()}) is active at [{T}, {H}]", self.where)

    def ag(self, x: torch.Tensor) -> torch.Tensor:
        if self.P == 1:
            return x
        if self.on_sim:
            c = self._comm("ag")
            self._check(c, x.shape[0] * self.P, x.shape[1], "the all-gathered tensor")
            c.local_chunk().copy_(x)
            self._empty_gemm(c)
            return c.buffer().clone()
        import torch.distributed as dist
        out = torch.empty((x.shape[0] * self.P, x.shape[1]), dtype=x.dtype, device=x.device)
        try:
            dist.all_gather_into_tensor(out, x.contiguous(), group=self.group)
        except (RuntimeError, AttributeError, NotImplementedError):
            parts = [torch.empty_like(x) for _ in range(self.P)]
            dist.all_gather(parts, x.contiguous(), group=self.group)
            out = torch.cat(parts)
        return out

    def rs(self, y: torch.Tensor) -> torch.Tensor:
        if self.P == 1:
            return y
        if y.shape[0] % self.P:
            raise TpflexDivisibleError(f"{y.shape[0]} rows do not divide among {self.P} ranks",
                                       self.where)
        if self.on_sim:
            c = self._comm("rs")
            self._check(c, y.shape[0], y.shape[1], "the reduce-scattered tensor")
            c.buffer().copy_(y)
            self._empty_gemm(c)
            return c.local_chunk().clone()
        import torch.distributed as dist
        n = y.shape[0] // self.P
        out = torch.empty((n, y.shape[1]), dtype=y.dtype, device=y.device)
        try:
            dist.reduce_scatter_tensor(out, y.contiguous(), group=self.group)
        except (RuntimeError, AttributeError, NotImplementedError):
            t = y.contiguous().clone()
            dist.all_reduce(t, group=self.group)
            r = dist.get_rank(self.group)
            out = t[r * n:(r + 1) * n].clone()
        return out

    def ar(self, y: torch.Tensor) -> torch.Tensor:
        if self.P == 1:
            return y
        if self.on_sim:
            return self.ag(self.rs(y))
        import torch.distributed as dist
        t = y.contiguous().clone()
        dist.all_reduce(t, group=self.group)
        return t
