"""The operations as torch.library custom ops: what torch.compile traces.

Each operation is two ops: the functional one allocates and returns its output (beta is 0: there
is no D to read); the _out one writes `out` and returns nothing (beta != 0 reads it: a mutated
argument is read and written). Both declare `buffer` (the communicator's active buffer view,
the registration the collective writes) mutated. The communicator is (comm, key), resolved on
the calling thread (_state.resolve). The fake implementations compute the output from the
tensors' metadata alone, with the same checks and messages (the C operand rulebook, a pure
function: no communicator, no C operation)."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from ._checks import default_out_dtype, dims, matrix, plan_ag_gemm, plan_bulk, plan_gemm_rs
from ._lib import lib
from ._options import make_opts
from ._state import resolve

OP_NAMES = ("ag_gemm", "ag_gemm_out", "gemm_rs", "gemm_rs_out", "bulk_overlap",
            "bulk_overlap_out")


def _ag_gemm_impl(comm: str, key: int, buffer: torch.Tensor, weight: torch.Tensor,
                  out: Optional[torch.Tensor], bias: Optional[torch.Tensor], trans_w: bool,
                  alpha: float, beta: float, gelu: bool, num_splits: int,
                  stream: Optional[int], a_scale_inv: Optional[torch.Tensor] = None,
                  w_scale_inv: Optional[torch.Tensor] = None) -> torch.Tensor:
    where = f"ag_gemm on '{comm}'"
    c = resolve(comm, key, where)
    o = make_opts(False, trans_w, alpha, beta, bias, gelu, num_splits, a_scale_inv, w_scale_inv)
    live = c._registration_arg(where, buffer)  # refreshes c's geometry: c._active is current
    T, H = c._active
    N, ld_w, ld_d = plan_ag_gemm(where, c.device, c.dtype, T, H, weight, out, bias, trans_w,
                                 a_scale_inv, w_scale_inv)
    if out is None:
        out, ld_d = torch.empty((T, N), dtype=default_out_dtype(c.dtype), device=c.device), N
    c._call(where, lib.tpf_ag_gemm, lib.tpf_ag_gemm_ex, (matrix(weight, ld_w), matrix(out, ld_d)),
            o, bias, stream, buffer, live)
    return out


def _gemm_rs_impl(comm: str, key: int, tp_size: int, buffer: torch.Tensor, x: torch.Tensor,
                  weight: torch.Tensor, out: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                  trans_a: bool, trans_w: bool, alpha: float, beta: float, gelu: bool,
                  num_splits: int, stream: Optional[int],
                  a_scale_inv: Optional[torch.Tensor] = None,
                  w_scale_inv: Optional[torch.Tensor] = None) -> torch.Tensor:
    where = f"gemm_rs on '{comm}'"
    c = resolve(comm, key, where)
    o = make_opts(trans_a, trans_w, alpha, beta, bias, gelu, num_splits, a_scale_inv,
                  w_scale_inv)
    live = c._registration_arg(where, buffer)  # refreshes c's geometry: c._active is current
    T, H = c._active
    rows, ld_x, ld_w, ld_d = plan_gemm_rs(where, c.device, c.dtype, T, H, c.tp_size, x, weight,
                                          out, bias, trans_a, trans_w, a_scale_inv, w_scale_inv)
    if out is None:
        out, ld_d = torch.empty((rows, H), dtype=c.dtype, device=c.device), H
    c._call(where, lib.tpf_gemm_rs, lib.tpf_gemm_rs_ex,
            (matrix(x, ld_x), matrix(weight, ld_w), matrix(out, ld_d)), o, bias, stream,
            buffer, live)
    return out


def _bulk_impl(comm: str, key: int, buffer: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               out: Optional[torch.Tensor], bias: Optional[torch.Tensor], trans_a: bool,
               trans_w: bool, alpha: float, beta: float, gelu: bool, num_splits: int,
               stream: Optional[int], a_scale_inv: Optional[torch.Tensor] = None,
               w_scale_inv: Optional[torch.Tensor] = None) -> torch.Tensor:
    where = f"bulk_overlap on '{comm}'"
    c = resolve(comm, key, where)
    o = make_opts(trans_a, trans_w, alpha, beta, bias, gelu, num_splits, a_scale_inv,
                  w_scale_inv)
    live = c._registration_arg(where, buffer)
    M, N, ld_a, ld_b, ld_d = plan_bulk(where, c.device, a, b, out, bias, trans_a, trans_w,
                                       a_scale_inv, w_scale_inv)
    if out is None:
        out, ld_d = torch.empty((M, N), dtype=default_out_dtype(a.dtype), device=c.device), N
    c._call(where, lib.tpf_bulk_overlap, lib.tpf_bulk_overlap_ex,
            (matrix(a, ld_a), matrix(b, ld_b), matrix(out, ld_d)), o, bias, stream, buffer,
            live)
    return out


def fake_buffer(where: str, buffer: torch.Tensor) -> Tuple[Any, Any]:
    dims(where, "buffer", buffer)
    return buffer.shape[0], buffer.shape[1]


def _register_ops() -> None:
    if hasattr(torch.ops.tpflex, "ag_gemm"):  # another copy of this module registered them
        return
    lib_def = torch.library.custom_op

    @lib_def("tpflex::ag_gemm", mutates_args=("buffer",))
    def ag_gemm(comm: str, key: int, buffer: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor], trans_w: bool, alpha: float, gelu: bool,
                num_splits: int, stream: Optional[int],
                a_scale_inv: Optional[torch.Tensor] = None,
                w_scale_inv: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _ag_gemm_impl(comm, key, buffer, weight, None, bias, trans_w, alpha, 0.0, gelu,
                             num_splits, stream, a_scale_inv, w_scale_inv)

    @ag_gemm.register_fake
    def _(comm: Any, key: Any, buffer: Any, weight: Any, bias: Any, trans_w: Any, alpha: Any,
          gelu: Any, num_splits: Any, stream: Any, a_scale_inv: Any = None,
          w_scale_inv: Any = None) -> Any:
        where = f"ag_gemm on '{comm}'"
        T, H = fake_buffer(where, buffer)
        N = plan_ag_gemm(where, buffer.device, buffer.dtype, T, H, weight, None, bias,
                         trans_w, a_scale_inv, w_scale_inv)[0]
        return buffer.new_empty((T, N), dtype=default_out_dtype(buffer.dtype))

    @lib_def("tpflex::ag_gemm_out", mutates_args=("buffer", "out"))
    def ag_gemm_out(comm: str, key: int, buffer: torch.Tensor, weight: torch.Tensor,
                    out: torch.Tensor, bias: Optional[torch.Tensor], trans_w: bool, alpha: float,
                    beta: float, gelu: bool, num_splits: int, stream: Optional[int],
                    a_scale_inv: Optional[torch.Tensor] = None,
                    w_scale_inv: Optional[torch.Tensor] = None) -> None:
        _ag_gemm_impl(comm, key, buffer, weight, out, bias, trans_w, alpha, beta, gelu,
                      num_splits, stream, a_scale_inv, w_scale_inv)

    @ag_gemm_out.register_fake
    def _(comm: Any, key: Any, buffer: Any, weight: Any, out: Any, bias: Any, trans_w: Any,
          alpha: Any, beta: Any, gelu: Any, num_splits: Any, stream: Any, a_scale_inv: Any = None,
          w_scale_inv: Any = None) -> Any:
        where = f"ag_gemm on '{comm}'"
        T, H = fake_buffer(where, buffer)
        plan_ag_gemm(where, buffer.device, buffer.dtype, T, H, weight, out, bias, trans_w,
                     a_scale_inv, w_scale_inv)

    @lib_def("tpflex::gemm_rs", mutates_args=("buffer",))
    def gemm_rs(comm: str, key: int, tp_size: int, buffer: torch.Tensor, x: torch.Tensor,
                weight: torch.Tensor, bias: Optional[torch.Tensor], trans_a: bool, trans_w: bool,
                alpha: float, gelu: bool, num_splits: int, stream: Optional[int],
                a_scale_inv: Optional[torch.Tensor] = None,
                w_scale_inv: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _gemm_rs_impl(comm, key, tp_size, buffer, x, weight, None, bias, trans_a, trans_w,
                             alpha, 0.0, gelu, num_splits, stream, a_scale_inv, w_scale_inv)

    def _rs_fake(comm: Any, tp_size: Any, buffer: Any, x: Any, weight: Any, out: Any, bias: Any,
                 trans_a: Any, trans_w: Any, a_scale_inv: Any, w_scale_inv: Any) -> Any:
        where = f"gemm_rs on '{comm}'"
        H = fake_buffer(where, buffer)[1]
        xr, xc = dims(where, "x", x)
        return plan_gemm_rs(where, buffer.device, buffer.dtype, xc if trans_a else xr, H,
                            tp_size, x, weight, out, bias, trans_a, trans_w, a_scale_inv,
                            w_scale_inv)[0], H

    @gemm_rs.register_fake
    def _(comm: Any, key: Any, tp_size: Any, buffer: Any, x: Any, weight: Any, bias: Any,
          trans_a: Any, trans_w: Any, alpha: Any, gelu: Any, num_splits: Any, stream: Any,
          a_scale_inv: Any = None, w_scale_inv: Any = None) -> Any:
        return buffer.new_empty(_rs_fake(comm, tp_size, buffer, x, weight, None, bias, trans_a,
                                         trans_w, a_scale_inv, w_scale_inv))

    @lib_def("tpflex::gemm_rs_out", mutates_args=("buffer", "out"))
    def gemm_rs_out(comm: str, key: int, tp_size: int, buffer: torch.Tensor, x: torch.Tensor,
                    weight: torch.Tensor, out: torch.Tensor, bias: Optional[torch.Tensor],
                    trans_a: bool, trans_w: bool, alpha: float, beta: float, gelu: bool,
                    num_splits: int, stream: Optional[int],
                    a_scale_inv: Optional[torch.Tensor] = None,
                    w_scale_inv: Optional[torch.Tensor] = None) -> None:
        _gemm_rs_impl(comm, key, tp_size, buffer, x, weight, out, bias, trans_a, trans_w, alpha,
                      beta, gelu, num_splits, stream, a_scale_inv, w_scale_inv)

    @gemm_rs_out.register_fake
    def _(comm: Any, key: Any, tp_size: Any, buffer: Any, x: Any, weight: Any, out: Any,
          bias: Any, trans_a: Any, trans_w: Any, alpha: Any, beta: Any, gelu: Any, num_splits: Any,
          stream: Any, a_scale_inv: Any = None, w_scale_inv: Any = None) -> Any:
        _rs_fake(comm, tp_size, buffer, x, weight, out, bias, trans_a, trans_w, a_scale_inv,
                 w_scale_inv)

    @lib_def("tpflex::bulk_overlap", mutates_args=("buffer",))
    def bulk_overlap(comm: str, key: int, buffer: torch.Tensor, a: torch.Tensor,
                     b: torch.Tensor, bias: Optional[torch.Tensor], trans_a: bool, trans_w: bool,
                     alpha: float, gelu: bool, num_splits: int, stream: Optional[int],
                     a_scale_inv: Optional[torch.Tensor] = None,
                     w_scale_inv: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _bulk_impl(comm, key, buffer, a, b, None, bias, trans_a, trans_w, alpha, 0.0, gelu,
                          num_splits, stream, a_scale_inv, w_scale_inv)

    @bulk_overlap.register_fake
    def _(comm: Any, key: Any, buffer: Any, a: Any, b: Any, bias: Any, trans_a: Any, trans_w: Any,
          alpha: Any, gelu: Any, num_splits: Any, stream: Any, a_scale_inv: Any = None,
          w_scale_inv: Any = None) -> Any:
        where = f"bulk_overlap on '{comm}'"
        fake_buffer(where, buffer)
        M, N = plan_bulk(where, buffer.device, a, b, None, bias, trans_a, trans_w, a_scale_inv,
                         w_scale_inv)[:2]
        return a.new_empty((M, N), dtype=default_out_dtype(a.dtype))

    @lib_def("tpflex::bulk_overlap_out", mutates_args=("buffer", "out"))
    def bulk_overlap_out(comm: str, key: int, buffer: torch.Tensor, a: torch.Tensor,
                         b: torch.Tensor, out: torch.Tensor, bias: Optional[torch.Tensor],
                         trans_a: bool, trans_w: bool, alpha: float, beta: float, gelu: bool,
                         num_splits: int, stream: Optional[int],
                         a_scale_inv: Optional[torch.Tensor] = None,
                         w_scale_inv: Optional[torch.Tensor] = None) -> None:
        _bulk_impl(comm, key, buffer, a, b, out, bias, trans_a, trans_w, alpha, beta, gelu,
                   num_splits, stream, a_scale_inv, w_scale_inv)

    @bulk_overlap_out.register_fake
    def _(comm: Any, key: Any, buffer: Any, a: Any, b: Any, out: Any, bias: Any, trans_a: Any,
          trans_w: Any, alpha: Any, beta: Any, gelu: Any, num_splits: Any, stream: Any,
          a_scale_inv: Any = None, w_scale_inv: Any = None) -> Any:
        where = f"bulk_overlap on '{comm}'"
        fake_buffer(where, buffer)
        plan_bulk(where, buffer.device, a, b, out, bias, trans_a, trans_w, a_scale_inv,
                  w_scale_inv)


_register_ops()
op_ag_gemm: Any = torch.ops.tpflex.ag_gemm.default
op_ag_gemm_out: Any = torch.ops.tpflex.ag_gemm_out.default
op_gemm_rs: Any = torch.ops.tpflex.gemm_rs.default
op_gemm_rs_out: Any = torch.ops.tpflex.gemm_rs_out.default
op_bulk_overlap: Any = torch.ops.tpflex.bulk_overlap.default
op_bulk_overlap_out: Any = torch.ops.tpflex.bulk_overlap_out.default


