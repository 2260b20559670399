"""TransformerEngine's module functions over tpflex: initialize_ub (TE's signature, positional
order included; the keyword-only tail is tpflex's), set_ub_active_shape, get_ub, destroy_ub and
legal_rows, and the translation of TE's ub_cfgs.

TE's ub_cfgs keys, and what tpflex does with each:

    method            honoured: "ring_exchange" (or "ring"), "pipeline", "bulk"
    is_reduce_scatter honoured: the collective (True: RS, False: AG); tpflex's "coll" ("ag"/"rs")
                      is accepted too
    num_splits        honoured: the communicator's default split count (0: the library's default)
    aggregate         honoured (RING AG, even P)
    fp8_buf           honoured as TE does: with use_fp8 the all-gather sites TE lists
                      (FP8_AG_SITES) and every AG site with fp8_buf=True register in FP8
                      (SPEC §11): torch.float8_e4m3fn, torch.float8_e5m2 for the sites that
                      gather gradients (proj_dgrad, fc2_dgrad: TE's HYBRID recipe); fp8_buf=True
                      on a reduce-scatter site is refused (its buffer holds partial sums)
    use_ce            True is what tpflex always does (peer copies on the copy engine); False is
                      ignored with a warning
    atomic_gemm       False accepted; True refused (TpflexUnsupportedError)
    num_sm, cga_size, set_sm_margin, comm_priority, gemm_priority, pipeline_rs_overlap_first_gemm
                      ignored with one warning per key (TpflexConfigWarning) naming the key and the
                      sites that set it: tpflex moves data on the copy engine and does not take
                      SM counts or stream priorities per communicator
    external          tpflex's: the site is managed outside tpflex and stays at capacity

As in TE, giving qkv_dgrad or fc1_dgrad a method other than "bulk" makes it a reduce-scatter site
and drops the matching *_wgrad site (which must then not be configured)."""
from __future__ import annotations

import enum
import os
import warnings
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from . import _lib, sim
from ._bootstrap import (HAVE_SIM_PROCS, CudaBackend, GlooBootstrap, SimProcsBackend, agree,
                         gloo_group)
from ._checks import I32_MAX, U32_MAX, as_shape, bool_arg, int_arg
from ._comm import Communicator
from ._lib import Shape
from ._manager import Manager
from ._state import state
from ._types import GEMM_DTYPES
from .errors import (TpflexConfigWarning, TpflexInvalidError, TpflexStateError,
                     TpflexUnsupportedError)

# TE's default configuration, in registration order (the same table as `tpflex demo`,
# tools/cmd_demo.c kSites). proj_wgrad and fc2_wgrad are tpflex's: external sites.
DEFAULT_UB_CFGS: Dict[str, Dict[str, Any]] = {
    "qkv_fprop": {"method": "ring_exchange", "is_reduce_scatter": False},
    "proj_fprop": {"method": "pipeline", "is_reduce_scatter": True},
    "fc1_fprop": {"method": "ring_exchange", "is_reduce_scatter": False},
    "fc2_fprop": {"method": "pipeline", "is_reduce_scatter": True},
    "qkv_dgrad": {"method": "bulk", "is_reduce_scatter": False},
    "qkv_wgrad": {"method": "bulk", "is_reduce_scatter": True},
    "fc1_dgrad": {"method": "bulk", "is_reduce_scatter": False},
    "fc1_wgrad": {"method": "bulk", "is_reduce_scatter": True},
    "proj_dgrad": {"method": "ring_exchange", "is_reduce_scatter": False},
    "fc2_dgrad": {"method": "ring_exchange", "is_reduce_scatter": False},
    "proj_wgrad": {"method": "bulk", "is_reduce_scatter": False, "external": True},
    "fc2_wgrad": {"method": "bulk", "is_reduce_scatter": False, "external": True},
}
METHODS: Dict[str, str] = {"ring_exchange": "ring", "ring": "ring", "pipeline": "pipeline",
                           "bulk": "bulk"}
TE_KEYS: Tuple[str, ...] = ("method", "num_sm", "cga_size", "num_splits", "set_sm_margin",
                            "atomic_gemm", "aggregate", "is_reduce_scatter", "use_ce", "fp8_buf",
                            "comm_priority", "gemm_priority", "pipeline_rs_overlap_first_gemm")
TPFLEX_KEYS: Tuple[str, ...] = ("coll", "external")
IGNORED_KEYS: Dict[str, str] = {
    "num_sm": "tpflex moves peer data on the copy engine (no communication SMs to count)",
    "cga_size": "tpflex launches no communication kernels with a cluster size",
    "set_sm_margin": "tpflex's GEMMs do not reserve SMs for communication kernels",
    "comm_priority": "tpflex enqueues on the caller's stream (no stream priorities)",
    "gemm_priority": "tpflex enqueues on the caller's stream (no stream priorities)",
    "pipeline_rs_overlap_first_gemm": "tpflex's PIPELINE RS schedule is fixed by the library",
}
BOOTSTRAP_BACKENDS: Tuple[str, ...] = ("gloo", "mpi", "nccl")
_DGRAD_RS = ("qkv_dgrad", "fc1_dgrad")
# TE's layers_all_gather_overlap: the sites whose buffers are FP8 under use_fp8 (fp8_buf).
FP8_AG_SITES: Tuple[str, ...] = ("qkv_fprop", "qkv_dgrad", "proj_dgrad", "fc1_fprop", "fc1_dgrad",
                                 "fc2_dgrad")
# The sites that gather a gradient (dY): E5M2 under TE's HYBRID recipe; the others E4M3.
FP8_E5M2_SITES: Tuple[str, ...] = ("proj_dgrad", "fc2_dgrad")


class UserBufferQuantizationMode(enum.Enum):
    """TE's quantization mode of a userbuffer registration (module/base.py): NONE registers the
    sites in initialize_ub's dtype, FP8 registers TE's fp8_buf all-gather sites in FP8."""
    NONE = "none"
    FP8 = "fp8"


# With both modes registered, the FP8 mode's communicators carry this suffix (TE keys its
# communicators by (name, mode); get_ub(name, use_fp8=True) finds them).
FP8_SUFFIX = ".fp8"


class SiteConfig(NamedTuple):
    """One communicator's configuration in tpflex's terms."""
    method: str      # "bulk", "pipeline", "ring"
    coll: str        # "ag", "rs"
    external: bool
    num_splits: int
    aggregate: bool
    fp8_buf: bool = False  # TE's fp8_buf as given (FP8 only with use_fp8: fp8_dtype)


def fp8_dtype(site: str, c: SiteConfig, use_fp8: bool) -> Optional[torch.dtype]:
    """The FP8 dtype `site` registers in under use_fp8 (None: the unquantized dtype)."""
    if not use_fp8 or c.external or c.coll != "ag" or not (c.fp8_buf or site in FP8_AG_SITES):
        return None
    return torch.float8_e5m2 if site in FP8_E5M2_SITES else torch.float8_e4m3fn


def _method(where: str, site: str, v: Any) -> str:
    m = METHODS.get(v) if isinstance(v, str) else None
    if m is None:
        raise TpflexInvalidError(f"ub_cfgs['{site}']['method']={v!r}: methods are "
                                 f"{', '.join(repr(k) for k in METHODS)}", where)
    return m


def resolve_cfgs(ub_cfgs: Any, where: str = "initialize_ub") -> Dict[str, SiteConfig]:
    """TE's defaults updated by `ub_cfgs` ({site: {key: value}}), as SiteConfigs in registration
    order. Emits one TpflexConfigWarning per ignored key; raises on an unknown key, a bad value
    or a feature tpflex lacks."""
    if ub_cfgs is None:
        ub_cfgs = {}
    if not isinstance(ub_cfgs, dict):
        raise TpflexInvalidError(f"ub_cfgs must be a dict {{site: {{key: value}}}} or None, got "
                                 f"{type(ub_cfgs).__name__}", where)
    cfgs: Dict[str, Dict[str, Any]] = {k: dict(v) for k, v in DEFAULT_UB_CFGS.items()}
    for site, user in ub_cfgs.items():
        if not isinstance(site, str) or not site:
            raise TpflexInvalidError(f"ub_cfgs key {site!r} must be a site name (a non-empty str)",
                                     where)
        if not isinstance(user, dict):
            raise TpflexInvalidError(f"ub_cfgs['{site}'] must be a dict, got "
                                     f"{type(user).__name__}", where)
        unknown = [k for k in user if k not in TE_KEYS + TPFLEX_KEYS]
        if unknown:
            raise TpflexInvalidError(f"ub_cfgs['{site}']: unknown keys {unknown} (TE's: "
                                     f"{', '.join(TE_KEYS)}; tpflex's: {', '.join(TPFLEX_KEYS)})",
                                     where)
    # TE: a dgrad site given a non-bulk method overlaps a reduce-scatter and its wgrad site goes.
    for site in _DGRAD_RS:
        user = ub_cfgs.get(site, {})
        if "method" in user and _method(where, site, user["method"]) != "bulk":
            wgrad = site.replace("dgrad", "wgrad")
            if wgrad in ub_cfgs:
                raise TpflexInvalidError(
                    f"ub_cfgs['{site}']['method']={user['method']!r} makes {site} the "
                    f"reduce-scatter site in place of {wgrad} (as TE does): {wgrad} must not be "
                    f"configured too", where)
            cfgs.pop(wgrad, None)
            cfgs[site]["is_reduce_scatter"] = True
    ignored: Dict[str, List[str]] = {}
    out: Dict[str, SiteConfig] = {}
    for site, user in ub_cfgs.items():
        cfgs.setdefault(site, {}).update(user)
    for site, c in cfgs.items():
        user = ub_cfgs.get(site, {})
        if "method" not in c:
            raise TpflexInvalidError(f"ub_cfgs['{site}'] is a new site: give its 'method'", where)
        method = _method(where, site, c["method"])
        coll = None
        if "is_reduce_scatter" in c:
            coll = "rs" if bool_arg(where, f"ub_cfgs['{site}']['is_reduce_scatter']",
                                    c["is_reduce_scatter"]) else "ag"
        if "coll" in user:
            v = user["coll"]
            if v not in ("ag", "rs"):
                raise TpflexInvalidError(f"ub_cfgs['{site}']['coll']={v!r}: 'ag' or 'rs'", where)
            if "is_reduce_scatter" in user and v != coll:
                raise TpflexInvalidError(
                    f"ub_cfgs['{site}']: coll={v!r} and is_reduce_scatter="
                    f"{user['is_reduce_scatter']!r} disagree", where)
            coll = v
        if coll is None:
            raise TpflexInvalidError(f"ub_cfgs['{site}'] is a new site: give "
                                     f"'is_reduce_scatter' (or tpflex's 'coll')", where)
        num_splits = int_arg(where, f"ub_cfgs['{site}']['num_splits']", c.get("num_splits", 0),
                             0, I32_MAX, ctype="int")
        aggregate = bool_arg(where, f"ub_cfgs['{site}']['aggregate']", c.get("aggregate", False))
        external = bool_arg(where, f"ub_cfgs['{site}']['external']", c.get("external", False))
        if bool_arg(where, f"ub_cfgs['{site}']['atomic_gemm']", c.get("atomic_gemm", False)):
            raise TpflexUnsupportedError(
                f"ub_cfgs['{site}']['atomic_gemm']=True: tpflex has no atomic GEMM overlap "
                f"(TE's beta cuBLAS API, FP8 only); leave it False", where)
        fp8_buf = bool_arg(where, f"ub_cfgs['{site}']['fp8_buf']", c.get("fp8_buf", False))
        if fp8_buf and coll == "rs":
            raise TpflexUnsupportedError(
                f"ub_cfgs['{site}']['fp8_buf']=True on a reduce-scatter site: its buffer would "
                f"hold partial sums in fp8; tpflex keeps RS sites in the unquantized dtype and "
                f"takes fp8 x and weight there (SPEC §11)", where)
        if not bool_arg(where, f"ub_cfgs['{site}']['use_ce']", c.get("use_ce", True)):
            ignored.setdefault("use_ce", []).append(site)
        for k in IGNORED_KEYS:
            if k in user:
                ignored.setdefault(k, []).append(site)
        out[site] = SiteConfig(method, coll, external, num_splits, aggregate, fp8_buf)
    for k, sites in ignored.items():
        why = (IGNORED_KEYS[k] if k != "use_ce" else
               "tpflex always moves peer data on the copy engine")
        warnings.warn(TpflexConfigWarning(
            f"initialize_ub: ub_cfgs key '{k}' (set for {', '.join(sites)}) is ignored: {why}"),
            stacklevel=3)
    return out


def _mode(where: str, m: Any) -> UserBufferQuantizationMode:
    if isinstance(m, UserBufferQuantizationMode):
        return m
    # TE's own enum (transformer_engine.pytorch.module.base), or its value / name as a str.
    v = getattr(m, "value", m)
    name = v.lower() if isinstance(v, str) else None
    for mode in UserBufferQuantizationMode:
        if name in (mode.value, mode.name.lower()):
            return mode
    raise TpflexInvalidError(f"quantization_modes: unknown mode {m!r} (UserBufferQuantizationMode"
                             f".NONE or .FP8)", where)


def _quantization(where: str, use_fp8: Any,
                  quantization_modes: Any) -> List[UserBufferQuantizationMode]:
    """TE's use_fp8 / quantization_modes: the modes to register, in order. As TE: a non-empty
    quantization_modes (a list) wins; otherwise use_fp8 picks [FP8] or [NONE]."""
    fp8 = bool_arg(where, "use_fp8", use_fp8)
    if quantization_modes is None or (isinstance(quantization_modes, (list, tuple)) and
                                      not quantization_modes):
        return [UserBufferQuantizationMode.FP8 if fp8 else UserBufferQuantizationMode.NONE]
    if not isinstance(quantization_modes, (list, tuple)):
        raise TpflexInvalidError(f"quantization_modes must be a list of "
                                 f"UserBufferQuantizationMode, got "
                                 f"{type(quantization_modes).__name__}", where)
    modes = [_mode(where, m) for m in quantization_modes]
    if len(set(modes)) != len(modes):
        raise TpflexInvalidError(f"quantization_modes {[m.name for m in modes]} names a mode "
                                 f"twice: give each of NONE and FP8 at most once", where)
    if fp8 and UserBufferQuantizationMode.FP8 not in modes:
        warnings.warn(TpflexConfigWarning(
            "initialize_ub: use_fp8=True is ignored: quantization_modes is given and has no "
            "FP8 mode (as TE: quantization_modes replaces the deprecated use_fp8)"), stacklevel=3)
    return modes


def _cfgs_per_mode(where: str, ub_cfgs: Any, n: int) -> List[Any]:
    """TE's ub_cfgs: None or one dict for every mode, or a list of one (dict or None) per mode."""
    if ub_cfgs is None or isinstance(ub_cfgs, dict):
        return [ub_cfgs] * n
    if not isinstance(ub_cfgs, (list, tuple)):
        raise TpflexInvalidError(f"ub_cfgs must be a dict {{site: {{key: value}}}}, a list of "
                                 f"such dicts (one per quantization mode) or None, got "
                                 f"{type(ub_cfgs).__name__}", where)
    if len(ub_cfgs) != n:
        raise TpflexInvalidError(f"ub_cfgs is a list of {len(ub_cfgs)} entries but "
                                 f"quantization_modes has {n}: give one dict (or None) per mode, "
                                 f"in quantization_modes' order", where)
    for i, c in enumerate(ub_cfgs):
        if c is not None and not isinstance(c, dict):
            raise TpflexInvalidError(f"ub_cfgs[{i}] must be a dict {{site: {{key: value}}}} or "
                                     f"None (the list holds one per quantization mode), got "
                                     f"{type(c).__name__}", where)
    return list(ub_cfgs)


def registered_name(site: str, use_fp8: Optional[bool]) -> str:
    """The manager's name for TE's (site, mode): `site` itself, or site + FP8_SUFFIX for the
    FP8 mode when both modes are registered. use_fp8=None: `site` (the only or NONE mode's)."""
    modes = state().get("ub_modes")
    if use_fp8 is None or not modes:
        return site
    want = UserBufferQuantizationMode.FP8 if use_fp8 else UserBufferQuantizationMode.NONE
    if want not in modes:
        have = "/".join(m.name for m in modes)
        fix = ("quantization_modes=[UserBufferQuantizationMode.NONE, "
               "UserBufferQuantizationMode.FP8]")
        raise TpflexInvalidError(
            f"'{site}' with use_fp8={use_fp8}: initialize_ub registered the {have} mode only "
            f"(register both with initialize_ub(..., {fix}))", "get_ub")
    return site + FP8_SUFFIX if use_fp8 and len(modes) > 1 else site


def _bootstrap_backend(where: str, v: Any, backend: str) -> None:
    """TE's bootstrap_backend: accepted; tpflex bootstraps the CUDA backend over gloo."""
    if v is None:
        return
    name = str(v).lower() if isinstance(v, str) else None
    if name not in BOOTSTRAP_BACKENDS:
        raise TpflexInvalidError(f"bootstrap_backend={v!r}: TE's values are "
                                 f"{', '.join(BOOTSTRAP_BACKENDS)} (or None)", where)
    if backend == "sim":
        warnings.warn(TpflexConfigWarning(f"initialize_ub: bootstrap_backend={name!r} is ignored "
                                          "on the simulator (its ranks share memory)"),
                      stacklevel=3)
    elif name != "gloo":
        warnings.warn(TpflexConfigWarning(
            f"initialize_ub: bootstrap_backend={name!r} is ignored: tpflex bootstraps over a "
            "gloo group of the same ranks (several processes may then share one GPU)"),
            stacklevel=3)


def initialize_ub(shape: Sequence[int], tp_size: int, use_fp8: bool = False,
                  quantization_modes: Optional[List[UserBufferQuantizationMode]] = None,
                  dtype: torch.dtype = torch.bfloat16,
                  ub_cfgs: Optional[Union[Dict[str, Dict[str, Any]],
                                          List[Dict[str, Dict[str, Any]]]]] = None,
                  bootstrap_backend: Any = None, with_cublasmp: bool = False, *,
                  group: Any = None,
                  backend: Optional[str] = None, device: Any = None,
                  timeout_ms: Optional[int] = None) -> Manager:
    """Registers TE's default communicators (DEFAULT_UB_CFGS updated by ub_cfgs: see this
    module's docstring for every key) at capacity `shape` = [max_tokens, hidden], once.
    Collective over the tp group. Returns the manager (also the module's current one).

    TE's arguments: quantization_modes (a list of UserBufferQuantizationMode; None or empty:
    the deprecated use_fp8 picks [FP8] or [NONE]) registers TE's sites once per mode; the FP8
    mode registers TE's fp8_buf sites in FP8 (fp8_dtype: float8_e4m3fn, float8_e5m2 for
    proj_dgrad / fc2_dgrad), whose operations take fp8 weights and a_scale_inv= / w_scale_inv=
    (SPEC §11). With both modes the FP8 mode's communicators are named site + ".fp8"
    (get_ub(site, use_fp8=True) finds them). ub_cfgs is one dict for every mode or, as TE
    reads it, a list of one dict (or None) per mode in quantization_modes' order.
    bootstrap_backend takes TE's values ("gloo", "mpi", "nccl") and tpflex bootstraps over gloo
    whatever it says (a warning names what is ignored). with_cublasmp=True (TE's cuBLASMp
    backend) is refused: tpflex's own overlap is the backend.
    tpflex's: backend "sim" (inside tpflex.sim.run: its rank; elsewhere this process is one
    simulator rank of `group`, under torchrun on CPU tensors with torch.distributed initialised,
    gloo; timeout_ms bounds every wait for a peer, default 10 s), "cuda" (torch.distributed
    initialised; `group` is the tp group, default the world; `device` default
    torch.cuda.current_device(); timeout_ms bounds every device-side wait, default 30 s or
    TPF_CUDA_TIMEOUT_MS), or None for "sim" inside tpflex.sim.run and otherwise the environment
    variable TPFLEX_BACKEND ("sim" or "cuda"), else "cuda"."""
    where = "initialize_ub"
    if not isinstance(dtype, torch.dtype) or dtype not in GEMM_DTYPES:
        raise TpflexInvalidError(f"dtype={dtype!r} not supported (torch.bfloat16, torch.float16, "
                                 "torch.float32; FP8 sites come from use_fp8=True)", where)
    cap = as_shape(where, "shape", shape)
    P = int_arg(where, "tp_size", tp_size, 1, I32_MAX, ctype="int")
    modes = _quantization(where, use_fp8, quantization_modes)
    if bool_arg(where, "with_cublasmp", with_cublasmp):
        raise TpflexUnsupportedError(
            "with_cublasmp=True asks for TE's cuBLASMp backend (NVIDIA's distributed GEMM "
            "library, TE built with NVTE_WITH_CUBLASMP=1); tpflex has no cuBLASMp backend and "
            "runs its own overlap schedules: leave with_cublasmp=False", where)
    use_fp8 = UserBufferQuantizationMode.FP8 in modes
    if timeout_ms is not None:
        timeout_ms = int_arg(where, "timeout_ms", timeout_ms, 1, U32_MAX, ctype="unsigned")
    if backend is None:  # inside tpflex.sim.run: its rank; else TPFLEX_BACKEND, else CUDA
        backend = "sim" if sim.current() is not None else _env_backend(where)
    if backend not in ("sim", "cuda"):
        raise TpflexInvalidError(f"backend={backend!r}: 'sim' or 'cuda' (or None)", where)
    _bootstrap_backend(where, bootstrap_backend,
                       "sim" if backend == "sim" and sim.current() is not None else "cuda")
    per_mode = _cfgs_per_mode(where, ub_cfgs, len(modes))
    regs: List[Tuple[str, SiteConfig, Optional[torch.dtype]]] = []
    for mode, user in zip(modes, per_mode):
        fp8 = mode is UserBufferQuantizationMode.FP8
        suffix = FP8_SUFFIX if fp8 and len(modes) > 1 else ""
        for name, c in resolve_cfgs(user, where).items():
            regs.append((name + suffix, c, fp8_dtype(name, c, fp8)))
    cfgs = {name: c for name, c, _ in regs}
    st = state()
    if st.get("manager") is not None:
        raise TpflexStateError("initialize_ub called twice without destroy_ub", where)
    if backend == "sim" and sim.current() is None:  # ranks as processes (torchrun)
        mgr = _sim_procs_manager(cap, P, dtype, cfgs, group, device, timeout_ms, use_fp8)
    elif backend == "sim":
        ctx = sim.current()
        assert ctx is not None
        if ctx.tp_size != P:
            raise TpflexInvalidError(f"tp_size={P} but the simulator world has {ctx.tp_size} "
                                     "ranks", where)
        if group is not None or device is not None or timeout_ms is not None:
            raise TpflexInvalidError("group, device and timeout_ms are CUDA-backend arguments "
                                     "(the simulator world has its own timeout)", where)
        mgr = Manager(ctx.backend, P, ctx.rank, torch.device("cpu"), keep_world=ctx.keep_alive)
    else:
        mgr = _cuda_manager(cap, P, dtype, cfgs, group, device, timeout_ms, use_fp8)
    try:
        for name, c, fdt in regs:
            mgr.add(name, c.method, c.coll, fdt or dtype, cap,
                    external=c.external, num_splits=c.num_splits, aggregate=c.aggregate)
    except BaseException:
        mgr.destroy()
        raise
    st["manager"] = mgr
    st["ub_modes"] = tuple(modes)
    st.setdefault(sim.ON_CLOSE, {})["tpflex.torch"] = destroy_ub
    return mgr


def _env_backend(where: str) -> str:
    """TPFLEX_BACKEND ("sim" or "cuda"; unset or empty: "cuda"), so that a torchrun script runs on
    the simulator without an edit. An explicit backend= wins over it."""
    v = os.environ.get("TPFLEX_BACKEND", "").strip().lower()
    if v in ("", "cuda", "sim"):
        return v or "cuda"
    raise TpflexInvalidError(f"environment variable TPFLEX_BACKEND={v!r}: 'sim' or 'cuda' (or "
                             "unset for the default, 'cuda')", where)


def _agreed_desc(cap: Shape, tp_size: int, dtype: torch.dtype, cfgs: Dict[str, SiteConfig],
                 use_fp8: bool) -> List[Tuple[str, Any]]:
    """What every rank's initialize_ub arguments must agree on (compared by agree())."""
    desc: List[Tuple[str, Any]] = [("tp_size", tp_size), ("shape", [int(cap.rows), int(cap.cols)]),
                                   ("dtype", str(dtype)), ("use_fp8", use_fp8),
                                   ("communicators", list(cfgs))]
    for name, c in cfgs.items():
        for k, v in c._asdict().items():
            desc.append((f"{name}.{k}", v))
    return desc


def _sim_procs_manager(cap: Shape, tp_size: int, dtype: torch.dtype,
                       cfgs: Dict[str, SiteConfig], group: Any, device: Any,
                       timeout_ms: Optional[int], use_fp8: bool) -> Manager:
    """backend='sim' outside tpflex.sim.run: this process is one simulator rank of the group
    (tpf_sim_backend_create over the gloo bootstrap; registrations in POSIX shared memory);
    timeout_ms bounds every wait for a peer (default 10 s)."""
    where = "initialize_ub"
    if not HAVE_SIM_PROCS:
        raise TpflexUnsupportedError(f"the loaded libtpflex ({_lib.LIBRARY_PATH}) has no simulator "
                                     "with ranks as processes (tpf_sim_backend_create): rebuild "
                                     "it from this tree", where)
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise TpflexStateError(
            "backend='sim' outside tpflex.sim.run makes this process one simulator rank, "
            "bootstrapped over torch.distributed: call torch.distributed.init_process_group("
            "'gloo') first (torchrun --nproc-per-node P sets its environment), or run the ranks "
            "as threads with tpflex.sim.run", where)
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as e:
            raise TpflexInvalidError(f"device={device!r} is not a device ({e})", where) from None
        if dev.type != "cpu":
            raise TpflexInvalidError(f"device={device!r}: the simulator computes on CPU tensors "
                                     "(device='cpu' or None)", where)
    g = group if group is not None else dist.group.WORLD
    size = dist.get_world_size(g)
    if size != tp_size:
        raise TpflexInvalidError(f"tp_size={tp_size} but the process group has {size} ranks "
                                 "(pass the tp group as group=)", where)
    boot = GlooBootstrap(gloo_group(group))
    agree(boot, _agreed_desc(cap, tp_size, dtype, cfgs, use_fp8))
    be = SimProcsBackend(boot, timeout_ms)
    try:
        return Manager(be.handle, tp_size, boot.rank, torch.device("cpu"),  # type: ignore
                       owner=be)  # type: ignore[arg-type]
    except BaseException:
        be.destroy()
        raise


def _cuda_manager(cap: Shape, tp_size: int, dtype: torch.dtype, cfgs: Dict[str, SiteConfig],
                  group: Any, device: Any, timeout_ms: Optional[int],
                  use_fp8: bool = False) -> Manager:
    where = "initialize_ub"
    if not _lib.HAVE_CUDA:
        raise TpflexUnsupportedError(f"the loaded libtpflex ({_lib.LIBRARY_PATH}) has no CUDA "
                                     "backend: build with -DTPF_WITH_CUDA=ON", where)
    if not torch.cuda.is_available():
        raise TpflexUnsupportedError("backend='cuda' needs torch with CUDA and a GPU "
                                     "(torch.cuda.is_available() is False)", where)
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise TpflexStateError("backend='cuda' bootstraps over torch.distributed: call "
                               "torch.distributed.init_process_group first (torchrun sets its "
                               "environment); on one GPU shared by several processes use gloo",
                               where)
    g = group if group is not None else dist.group.WORLD
    size = dist.get_world_size(g)
    if size != tp_size:
        raise TpflexInvalidError(f"tp_size={tp_size} but the process group has {size} ranks "
                                 "(pass the tp group as group=)", where)
    try:
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else \
            torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise TpflexInvalidError(f"device={device!r} is not a device ({e})", where) from None
    if dev.type != "cuda":
        raise TpflexInvalidError(f"device={dev} is not a CUDA device", where)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(dev)
    torch.cuda.init()
    boot = GlooBootstrap(gloo_group(group))
    # Every rank's arguments agree before the backend or any registration exists.
    agree(boot, _agreed_desc(cap, tp_size, dtype, cfgs, use_fp8))
    be = CudaBackend(boot, dev, timeout_ms)
    try:
        return Manager(be.handle, tp_size, boot.rank, dev, owner=be)  # type: ignore[arg-type]
    except BaseException:
        be.destroy()
        raise


def current_manager() -> Manager:
    m = state().get("manager")
    if m is None:
        raise TpflexStateError("initialize_ub has not been called on this rank", "tpflex.torch")
    return m


def set_ub_active_shape(shape: Sequence[int]) -> None:
    """Applies [T, H] to every eligible communicator, all-or-nothing (local: no communication).
    A T some communicator refuses names it and the T to pad to (legal_rows)."""
    current_manager().set_active_shape(shape)


def get_ub(name: str, use_fp8: Optional[bool] = None) -> Communicator:
    """The communicator of site `name`: TE's get_ub(name, use_fp8) picks the registration of
    that quantization mode (use_fp8=None, tpflex's default: the site's only or NONE-mode one)."""
    if use_fp8 is not None:
        use_fp8 = bool_arg("get_ub", "use_fp8", use_fp8)
    mgr = current_manager()
    return mgr.get(registered_name(name, use_fp8))


def legal_rows(tokens: int) -> int:
    """The smallest T >= tokens that every registered communicator accepts."""
    return current_manager().legal_rows(tokens)


def destroy_ub() -> None:
    """Collective: destroys the communicators (and the CUDA backend). A view of a registration
    kept past it stays valid (simulator: the memory is released with the last view) or makes it
    refuse, changing nothing (CUDA: see Manager.destroy)."""
    st = state()
    m = st.get("manager")
    if m is None:
        return
    try:
        m.destroy()
    finally:
        if m._h is None:  # destroyed (or failed while destroying): no longer this rank's
            st.pop("manager", None)
            st.pop("ub_modes", None)
            st.get(sim.ON_CLOSE, {}).pop("tpflex.torch", None)
