"""The CUDA backend's bootstrap callbacks (tpflex.torch.GlooBootstrap) over a gloo process
group, on the CPU: what tpf_cuda_backend_create and tpf_comm_create call, exercised through C
function pointers (ctypes thunks) without a GPU. Also the initialize_ub argument agreement that
runs over the same group. Run under torchrun:

    torchrun --standalone --nproc-per-node 2 tests/python/test_bootstrap_gloo.py
"""
import ctypes
import datetime
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tpflex._lib as L  # noqa: E402
import tpflex.torch as tt  # noqa: E402
from tpflex._bootstrap import agree, gloo_group  # noqa: E402
from tpflex import errors as E  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"rank {dist.get_rank()}: FAIL {what}", flush=True)


def as_c(fn_type, cb):
    """The callback as C sees it: a bare function pointer called through libffi."""
    return fn_type(ctypes.cast(cb, ctypes.c_void_p).value)


def main() -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, P = dist.get_rank(), dist.get_world_size()
    g = gloo_group(None)
    check(g == dist.group.WORLD or g is dist.group.WORLD, "a gloo world group is used as is")
    # A generous bound for the exchanges that must succeed (a loaded 2-core CI machine building
    # the 1 MiB operands in Python took over 1 s); the short one only for the timeout case below.
    boot = tt.GlooBootstrap(g, timeout_ms=30000)
    st = boot.struct(device=0)
    check((st.tp_size, st.rank, st.device) == (P, rank, 0), "struct fields")
    ag = as_c(L.BOOT_ALLGATHER_FN, st.allgather)
    bar = as_c(L.BOOT_BARRIER_FN, st.barrier)

    # allgather through the C pointer: sizes 1, 24 (the peer record), 0 and 1 MiB.
    for n in (1, 24, 0, 1 << 20):
        send = (ctypes.c_uint8 * max(n, 1))(*[(rank * 31 + i) % 251 for i in range(max(n, 1))])
        recv = (ctypes.c_uint8 * max(P * n, 1))()
        rc = ag(None, ctypes.addressof(send), ctypes.addressof(recv), n)
        check(rc == 0, f"allgather {n} bytes rc {rc}: {L.last_error()}")
        got = bytes(recv)[:P * n]
        want = b"".join(bytes([(q * 31 + i) % 251 for i in range(n)]) for q in range(P))
        check(got == want, f"allgather {n} bytes: rank order and contents")
    check(bar(None) == 0, f"barrier: {L.last_error()}")

    # Variable-length exchange and the initialize_ub agreement.
    parts = boot.allgather_varlen(b"x" * (rank + 1))
    check(parts == [b"x" * (q + 1) for q in range(P)], "allgather_varlen")
    check(boot.allgather_object({"r": rank}) == [{"r": q} for q in range(P)], "allgather_object")
    same = [("tp_size", P), ("shape", [64, 32]), ("fc2_fprop.num_splits", 0)]
    try:
        agree(boot, same)
    except E.TpflexError as e:
        check(False, f"agreeing arguments raised {e!r}")
    differ = [("tp_size", P), ("shape", [64, 32]), ("fc2_fprop.num_splits", 2 if rank == 1 else 0)]
    try:
        agree(boot, differ)
        check(False, "differing arguments did not raise")
    except E.TpflexMismatchError as e:
        check("fc2_fprop.num_splits is 0 on rank 0, 2 on rank 1" in str(e), f"mismatch text: {e}")

    # A Python exception inside the callback: TPF_EBACKEND with the text, nothing raised in C.
    def broken(*_a):
        raise RuntimeError("boom")
    saved, boot.allgather = boot.allgather, broken
    send = (ctypes.c_uint8 * 4)()
    recv = (ctypes.c_uint8 * (4 * P))()
    rc = ag(None, ctypes.addressof(send), ctypes.addressof(recv), 4)
    check(rc == 12 and "boom" in L.last_error(), f"exception -> EBACKEND: {rc} {L.last_error()!r}")
    boot.allgather = saved

    # Timeout: rank 0 waits for a peer that comes late; bounded, TPF_ETIMEOUT with a detail.
    # The late rank then joins, which completes the pending exchange on both.
    check(bar(None) == 0, f"barrier before the timeout case: {L.last_error()}")
    boot.timeout_ms = 1000
    if rank == 0:
        t0 = time.monotonic()
        rc = ag(None, ctypes.addressof(send), ctypes.addressof(recv), 4)
        dt = time.monotonic() - t0
        check(rc == 9, f"timeout rc {rc} ({L.last_error()})")
        check("1000 ms" in L.last_error(), f"timeout detail: {L.last_error()!r}")
        check(dt < 10, f"timeout took {dt:.1f} s")
    else:
        time.sleep(2.5)
        ag(None, ctypes.addressof(send), ctypes.addressof(recv), 4)
    # The late exchange completed rank 0's pending one in the background; everyone meets again.
    boot.timeout_ms = 30000
    ok = boot.allgather_object(failures)
    bad = [(q, f) for q, fs in enumerate(ok) for f in fs]
    if rank == 0:
        print("test_bootstrap_gloo: " + ("every check OK" if not bad else f"FAILED {bad}"),
              flush=True)
    boot.allgather(b"\0")  # nobody tears the group down while a peer still uses it
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
