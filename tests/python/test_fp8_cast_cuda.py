"""The CUDA FP8 casts (tpflex_cuda.h: tpf_cuda_fp8_cast, tpf_cuda_fp8_amax,
tpf_cuda_transpose_bytes) against torch's operations, on a GPU: the same bits for every element
(special values included: ±0, subnormals, values past the format's range, ±inf, NaN), both
layouts, delayed scaling (the amax recorded into a running slot) and current scaling (the scale
computed from the amax on the device: 0, inf, NaN, subnormal amaxes, epsilon, powers of 2), the
byte transpose, fp8_mm's layouts against a dequantized reference (within 2e-3 of the largest
value: _scaled_mm's accumulation against torch's fp32 matmul; every layout gives the same
error), and the argument refusals.
Exit 77 (skipped) without CUDA or without a library built with the CUDA backend.

  python3 tests/python/test_fp8_cast_cuda.py"""
import os
import sys
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402

from tpflex import _quant as Q  # noqa: E402
from tpflex.errors import TpflexInvalidError  # noqa: E402

FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL:", what)


def same_fp8(a, b):
    """Equal bytes, or NaN in both."""
    eq = a.view(torch.uint8) == b.view(torch.uint8)
    return bool((eq | (a.float().isnan() & b.float().isnan())).all())


def ref_cast(x, s, dt):
    m = Q._FMAX[dt]
    return torch.mul(x, s).clamp_(-m, m).to(dt), torch.reciprocal(s)


def sample(rows, cols, dt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, cols, device="cuda", generator=g) * 40
    flat = x.view(-1)
    specials = [0.0, -0.0, 1e-40, -3e-39, 1e6, -1e6, 448.5, 57344.0 * 1.07, float("inf"),
                -float("inf"), 0.0013]
    for i, v in enumerate(specials[:flat.numel()]):
        flat[(i * 7919) % flat.numel()] = v
    return x.to(dt)


def main() -> int:
    if not torch.cuda.is_available():
        print("test_fp8_cast_cuda: skipped (no CUDA device)")
        return 77
    fns = Q._fast()
    if not fns:
        print("test_fp8_cast_cuda: skipped (the library has no CUDA backend, or "
              "TPFLEX_FP8_TORCH_CAST is set)")
        return 77
    shapes = [(1, 1), (3, 5), (33, 65), (257, 1031), (1024, 4096), (0, 16)]
    for xdt in (torch.bfloat16, torch.float16, torch.float32):
        for odt in (torch.float8_e4m3fn, torch.float8_e5m2):
            for k, (r, c) in enumerate(shapes):
                x = sample(r, c, xdt, k)
                if x.numel():
                    x.view(-1)[-1] = float("nan") if k % 2 else x.view(-1)[-1]
                tag = f"{xdt} -> {odt} [{r}, {c}]"
                s = torch.tensor([3.7], device="cuda")
                want, want_inv = ref_cast(x, s, odt)
                if not x.numel():   # the public cast takes torch's path for an empty tensor
                    got = Q.cast(x, s, odt)
                    check(got.data.shape == (r, c) and torch.equal(got.scale_inv, want_inv),
                          f"{tag}: empty")
                    continue
                # delayed: the scale given, the amax recorded into a running slot
                rec = torch.tensor([0.5], device="cuda")
                got = Q._fast_cast(fns, x, odt, s, record=rec)
                check(same_fp8(got.data, want), f"{tag}: cast bits")
                check(torch.equal(got.scale_inv, want_inv), f"{tag}: scale_inv")
                ref_amax = torch.maximum(torch.tensor([0.5], device="cuda"), torch.linalg.vector_norm(
                    x, float("inf"), dtype=torch.float32).reshape(1))
                check(torch.equal(rec, ref_amax) or (rec.isnan().all() and ref_amax.isnan().all()),
                      f"{tag}: recorded amax {rec.item()} vs {ref_amax.item()}")
                # the transposed layout alone
                t = torch.empty((c, r), dtype=odt, device="cuda")
                sinv = torch.empty(1, device="cuda")
                rc = fns[0](x.data_ptr(), Q._DT_CODE[xdt], r, c, None, t.data_ptr(),
                            Q._DT_CODE[odt], s.data_ptr(), None, 0.0, 0, sinv.data_ptr(), None,
                            torch.cuda.current_stream().cuda_stream)
                check(rc == 0, f"{tag}: out_t call {rc}")
                check(same_fp8(t, want.t().contiguous()), f"{tag}: transposed cast bits")
                check(torch.equal(sinv, want_inv), f"{tag}: transposed scale_inv")
                # the amax alone
                a = Q._fast_amax(fns, x)
                ra = torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32).reshape(1)
                check(torch.equal(a, ra) or (a.isnan().all() and ra.isnan().all()),
                      f"{tag}: amax {a.item()} vs {ra.item()}")
    x = sample(64, 96, torch.bfloat16, 9)
    for av in (0.0, float("inf"), float("nan"), 1e-40, 3.0, 1e-3, 5e37):
        for pow2, eps in ((False, 0.0), (True, 0.0), (False, 1e-2), (True, 1e-2)):
            for odt in (torch.float8_e4m3fn, torch.float8_e5m2):
                a = torch.tensor([av], device="cuda")
                got = Q._fast_cast(fns, x, odt, None, amax=a, pow2=pow2, eps=eps)
                s = Q.scale_from_amax(a, Q._FMAX[odt], pow2, eps)
                want, want_inv = ref_cast(x, s, odt)
                tag = f"current amax {av} pow2 {pow2} eps {eps} {odt}"
                check(torch.equal(got.scale_inv, want_inv),
                      f"{tag}: scale_inv {got.scale_inv.item()} vs {want_inv.item()}")
                check(same_fp8(got.data, want), f"{tag}: bits")
    # the byte transpose (4-byte tiles where rows and cols are multiples of 4, bytes elsewhere),
    # and fp8_mm's layouts against the dequantized product
    for r, c in ((33, 65), (4, 6), (96, 1028), (1, 4)):
        q = Q.cast(sample(r, c, torch.bfloat16, r), torch.tensor([2.0], device="cuda"),
                   torch.float8_e4m3fn)
        check(same_fp8(q.t_data(), q.data.t().contiguous()), f"transpose [{r}, {c}]")
    g = torch.Generator(device="cuda").manual_seed(3)
    for (m, n, k) in ((64, 48, 32), (128, 256, 96)):
        qa = Q.cast(torch.randn(m, k, device="cuda", generator=g), torch.tensor([20.0],
                    device="cuda"), torch.float8_e4m3fn)
        qb = Q.cast(torch.randn(n, k, device="cuda", generator=g), torch.tensor([30.0],
                    device="cuda"), torch.float8_e4m3fn)
        check(same_fp8(qa.t_data(), qa.data.t().contiguous()), f"transpose [{m}, {k}]")
        da, db = qa.dequantize(torch.float32), qb.dequantize(torch.float32)
        for ta, tb in ((False, True), (True, True), (False, False), (True, False)):
            A = Q.QTensor(qa.t_data() if ta else qa.data, qa.scale_inv)
            B = Q.QTensor(qb.data if tb else qb.t_data(), qb.scale_inv)
            y = Q.fp8_mm(A, B, torch.float32, trans_a=ta, trans_b=tb)
            ref = da @ db.t()
            err = float((y - ref).abs().max() / ref.abs().max())
            check(err < 2e-3, f"fp8_mm trans_a {ta} trans_b {tb} [{m}, {n}, {k}]: {err:.2e}")
        out = torch.ones(m, n, device="cuda")
        Q.fp8_mm(Q.QTensor(qa.data, qa.scale_inv), Q.QTensor(qb.data, qb.scale_inv),
                 torch.float32, trans_b=True, out=out, beta=1.0)
        ref = da @ db.t()
        err = float((out - 1 - ref).abs().max() / ref.abs().max())
        check(err < 2e-3, f"fp8_mm accumulating into out: {err:.2e}")
    # refusals: a status naming the argument, nothing launched
    from tpflex._lib import check as tcheck
    for args, word in (((None, 0, 1, 1, 1, None, 3, 1, None, 0.0, 0, 1, None, None), "x is NULL"),
                       ((1, 3, 1, 1, 1, None, 3, 1, None, 0.0, 0, 1, None, None), "x_dtype"),
                       ((1, 0, 1, 1, None, None, 3, 1, None, 0.0, 0, 1, None, None), "both NULL"),
                       ((1, 0, 1, 1, 1, None, 3, 1, 1, 0.0, 0, 1, None, None), "exactly one"),
                       ((1, 0, 1, 1, 1, None, 2, 1, None, 0.0, 0, 1, None, None), "out_dtype")):
        try:
            tcheck(fns[0](*args), "tpf_cuda_fp8_cast")
            check(False, f"refusal '{word}' not raised")
        except TpflexInvalidError as e:
            check(word in str(e), f"refusal '{word}': {e}")
    torch.cuda.synchronize()
    if FAILS:
        print(f"test_fp8_cast_cuda: {len(FAILS)} check(s) FAILED")
        return 1
    print("test_fp8_cast_cuda: every check OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
