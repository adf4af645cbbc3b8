"""specviz's native code: building it with the machine's C compiler, loading it, and calling it.

`csrc/few_rows.c` computes a linear layer for a call of 1-16 tokens while reading the weights once, and
`csrc/llama.c` runs a Llama model's forward pass around those products in one call (lean.py; why: their
headers). Both are compiled on first use (about two seconds with gcc) into one library in $SPECVIZ_HOME/kernels,
named by a hash of the sources and compiler flags (a built file loads without a compiler), so an edited source
builds anew and concurrent processes never load a half-written file. Without a C compiler, or on a CPU with
neither AVX-512 nor AVX2+FMA+F16C, `library()` is None and `why_not()` says why in one sentence; the linear layers
then keep PyTorch's paths (kernels.py chooses) and Llama models the lean forward's PyTorch ops (lean.py).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from specviz.config import SpecvizError, specviz_home
from specviz.host import cpus

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (CSRC / "few_rows.c", CSRC / "llama.c", CSRC / "greedy.c", CSRC / "chain.c")  # the products; a Llama
# model's forward pass (lean.py); greedy decoding's argmax (sampling.greedy); a draft's greedy and sampled chains
# (lean_chain.py)
FLAGS = ["-O2", "-fopenmp", "-shared", "-fPIC", "-ffp-contract=off"]
LIBS = ["-lm"]
PROBS_AT_MOST = 64  # the most entries probs_at reads in one call (csrc/llama.c's MAX_PROBS_AT)
MAX_ROWS = 16  # the kernel's M: the calls speculative decoding makes (a step, a verify of gamma + 1, a tree)
ISA_NAMES = {2: "AVX-512", 1: "AVX2"}

_why: list[str] = []  # the reason the last load failed, for why_not()
_sources: list[tuple[Path, ...]] = [SOURCES]  # what this process's library is built from (`build_from`)


def _compiler() -> str | None:
    cc = os.environ.get("CC", "").strip()
    return shutil.which(cc) if cc else shutil.which("gcc") or shutil.which("cc")


def build_from(sources: tuple[Path, ...]) -> None:
    """Build and load this process's library from `sources` instead of SOURCES (a measurement harness's
    instrumented copies, benchmarks/forward_steps.py); call it before anything loads the library."""
    _sources[0] = tuple(sources)
    library.cache_clear()


def _target() -> Path:
    """Where the library for this source and these flags lives (a new source builds a new file)."""
    tag = hashlib.sha256(b"".join(p.read_bytes() for p in _sources[0]) + " ".join(FLAGS).encode()).hexdigest()[:16]
    return specviz_home() / "kernels" / f"few_rows-{tag}.so"


def _build(cc: str, out: Path, sources: tuple[Path, ...] | None = None) -> None:
    """Compile the kernel from `sources` (default: this process's) into `out` (atomically: another process sees
    the whole file or none)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        staged = Path(tmp) / out.name
        done = subprocess.run(
            [cc, *FLAGS, *map(str, sources or _sources[0]), "-o", str(staged), *LIBS],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            raise OSError(f"{Path(cc).name} could not compile it ({first})")
        os.replace(staged, out)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel library, or None where it cannot run here (`why_not` says why). Built once per machine
    (a built library needs no compiler to load: a container builds it at setup), loaded once per process."""
    _why.clear()
    if os.environ.get("SPECVIZ_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        _why.append("turned off by SPECVIZ_NATIVE=0")
        return None
    out = _target()
    try:
        if not out.is_file():
            cc = _compiler()
            if cc is None:
                _why.append("no C compiler was found (install gcc, or set CC)")
                return None
            _build(cc, out)
        lib = ctypes.CDLL(str(out))
    except (OSError, subprocess.SubprocessError) as e:
        _why.append(f"its build failed: {e}")
        log.warning("specviz: the few-token kernel is not used: %s", _why[-1])
        return None
    lib.few_rows.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        *[ctypes.c_long] * 3,
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    lib.few_rows.restype = ctypes.c_int
    lib.llama_forward.argtypes = [
        *[ctypes.c_void_p] * 3,  # weights, scales, norms
        ctypes.c_long,  # layers
        ctypes.c_int,  # wtype
        *[ctypes.c_long] * 5,  # H, heads, kv heads, d, I
        ctypes.c_float,  # eps
        ctypes.c_void_p,  # x
        ctypes.c_long,  # L
        *[ctypes.c_void_p] * 2,  # key and value caches
        *[ctypes.c_long] * 2,  # capacity, base
        *[ctypes.c_void_p] * 6,  # cos, sin, mask, final norm, head, head scale
        ctypes.c_int,  # head wtype
        *[ctypes.c_long] * 2,  # V, out_rows
        *[ctypes.c_void_p] * 2,  # hn, logits
        ctypes.c_int,  # threads
    ]
    lib.llama_forward.restype = ctypes.c_int
    lib.llama_chain.argtypes = [
        *lib.llama_forward.argtypes[:19],  # as llama_forward's, up to sin
        *lib.llama_forward.argtypes[20:25],  # then no mask; final norm, head, head scale, head wtype, V
        *[ctypes.c_void_p] * 2,  # hn, logits
        ctypes.c_int,  # threads
        ctypes.c_void_p,  # embed
        ctypes.c_int,  # embed is float16
        ctypes.c_void_p,  # next_row
        ctypes.c_long,  # k
        ctypes.c_void_p,  # out
        ctypes.c_float,  # 1 / T
        *[ctypes.c_void_p] * 4,  # the uniforms (NULL: greedy), the proposal order, the scores and probabilities out
        ctypes.c_void_p,  # mix (NULL: none), added to the first guess's probabilities
        ctypes.c_float,  # keep: the draft's share of them
    ]
    lib.llama_chain.restype = ctypes.c_long
    lib.llama_tree_read.argtypes = [
        *lib.llama_chain.argtypes[:27],  # as llama_chain's, up to threads
        ctypes.c_void_p,  # embed
        ctypes.c_int,  # embed is float16
        ctypes.c_void_p,  # rows: the tokens' input rows
        *[ctypes.c_long] * 2,  # pos0, seen (-1: a plain call)
        ctypes.c_void_p,  # extra: the tree rows it sees
        *[ctypes.c_long] * 2,  # n_extra, n
        *[ctypes.c_void_p] * 2,  # top rows and probabilities out
    ]
    lib.llama_tree_read.restype = ctypes.c_long
    lib.top_probs.argtypes = [ctypes.c_void_p, *[ctypes.c_long] * 2, *[ctypes.c_void_p] * 2]  # a tree read's last step
    lib.first_max.argtypes = [ctypes.c_void_p, *[ctypes.c_long] * 3, ctypes.c_void_p]
    lib.first_max.restype = None
    lib.probs_at.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, *[ctypes.c_void_p] * 2, ctypes.c_long]
    lib.probs_at.argtypes += [ctypes.c_void_p]
    lib.few_rows_use_isa.argtypes = [ctypes.c_int]
    lib.few_rows_amx.restype = ctypes.c_int
    lib.few_rows_tiles_short.restype = ctypes.c_long
    lib.few_rows_refuse_split.argtypes = [ctypes.c_int]
    lib.llama_refuse_buffers.argtypes = [ctypes.c_int]
    lib.few_rows_panel_ahead.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.few_rows_passes.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.few_rows_pass_limits.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    if lib.few_rows_isa() == 0:
        _why.append("this CPU has neither AVX-512 nor AVX2 with FMA and F16C")
        return None
    return lib


def loaded() -> bool:
    """Whether the kernel library is loaded and available in this process (never builds or loads it to say so)."""
    return bool(library.cache_info().currsize) and library() is not None


def why_not() -> str | None:
    """Why the kernel is not available here, in words; None when it is."""
    return None if library() is not None else (_why[-1] if _why else "it is not available")


def isa() -> str | None:
    """The instruction set the kernel runs with here ("AVX-512", "AVX2"), or None."""
    lib = library()
    return ISA_NAMES.get(lib.few_rows_use_isa(-1)) if lib is not None else None  # -1: read, change nothing


def use_isa(name: str | None) -> str | None:
    """For tests: run the kernel with a lower instruction set than the CPU's best ("AVX2"); None: the best."""
    lib = library()
    if lib is None:
        return None
    level = {v: k for k, v in ISA_NAMES.items()}.get(name, 9)
    return ISA_NAMES.get(lib.few_rows_use_isa(level))


PANEL_PREFETCH = "L1:32"  # few_rows.c's compiled prefetch for the panels: into L1, 32 rows of k ahead


def panel_prefetch(setting: str | None = None) -> str | None:
    """How the panel kernels prefetch a weight panel in calls of 2+ tokens: "none", or "L1:32" / "L2:64" (the cache
    filled, rows of k ahead); with `setting`, first set it (any setting computes the same numbers; ValueError for
    one that is not of that form). None where the kernel is not available."""
    lib = library()
    if lib is None:
        return None
    if setting is not None:
        lib.few_rows_panel_ahead(*parse_prefetch(setting))
    rows = lib.few_rows_panel_ahead(-1, 0)
    return f"L{lib.few_rows_panel_level() + 1}:{rows}" if rows else "none"


def parse_prefetch(setting: str) -> tuple[int, int]:
    """("L2:64" -> (64, 1): rows of k ahead, cache level 0 for L1 or 1 for L2; "none" -> (0, 0))."""
    s = setting.strip().upper()
    if s == "NONE":
        return 0, 0
    level, _, rows = s.partition(":")
    if level not in ("L1", "L2") or not rows.isdigit() or not 0 < int(rows) <= 1024:
        raise ValueError(f"a panel prefetch is none, L1:ROWS or L2:ROWS (1-1024 rows), not {setting!r}")
    return int(rows), int(level[1]) - 1


@functools.cache
def pass_limits(wtype: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(few_rows.c's compiled rows of W per pass for weight type wtype, the most each call size takes), for calls of
    1..8 tokens; None where the library is not here or wtype is not float32 0, float16 1 or int8 2."""
    lib = library()
    defaults, most = (ctypes.c_int * 9)(), (ctypes.c_int * 9)()
    if lib is None or lib.few_rows_pass_limits(wtype, defaults, most):
        return None
    return tuple(defaults[1:]), tuple(most[1:])


def passes(wtype: int) -> tuple[int, ...] | None:
    """Rows of W per pass of the AVX2 rows kernels for a call of 1..8 tokens, for weight type wtype (float32 0,
    float16 1, int8 2; few_rows.c); None where those kernels do not run (no kernel, AVX-512 in use)."""
    lib = library()
    if lib is None or isa() != "AVX2" or wtype not in (0, 1, 2):
        return None
    out = (ctypes.c_int * 9)()
    lib.few_rows_passes(wtype, None, out)
    return tuple(out[1:])


def set_passes(wtype: int, rows: tuple[int, ...]) -> None:
    """Set `passes` (a value per call size 1..8, each 1 .. its most: `pass_limits`). Any setting computes the same
    numbers: each output is the same chain of operations whatever the rows per pass; only the speed differs by CPU."""
    lib = library()
    if lib is None or len(rows) != 8 or lib.few_rows_passes(wtype, (ctypes.c_int * 9)(0, *rows), None):
        raise ValueError(f"rows per pass {rows} for weight type {wtype}: out of range or no kernel here")


WTYPES = {torch.float32: 0, torch.float16: 1, torch.int8: 2, torch.uint8: 3}  # the kernel's weight types (uint8:
# bitsandbytes' NF4, two weights a byte)


PANELS = 4  # added to a weight type: the weight is packed in panels (`pack`)


def can_pack(weight: torch.Tensor) -> bool:
    """Whether the kernel can read this (N, K) weight packed in panels: float32, float16 or int8."""
    return weight.dim() == 2 and weight.dtype in (torch.float32, torch.float16, torch.int8)


def _padded(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) with zero rows after it up to a multiple of 16 (a panel's columns)."""
    n, k = weight.shape
    return torch.cat([weight, weight.new_zeros(-n % 16, k)]) if n % 16 else weight


def pack(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) -> (ceil(N / 16), K, 16), contiguous: panel p holds output columns 16p .. 16p + 15, one row of 16 per k
    (zeros past N), so the kernel streams each panel front to back and keeps every output in a vector lane of its
    own (few_rows.c)."""
    return _padded(weight).view(-1, 16, weight.shape[1]).transpose(1, 2).contiguous()


QBLOCK = 32  # few_rows.c's block of x quantised with one scale (int8 activations, `pack8`)
ACT8 = 7  # the kernel's weight type of `pack8`'s panels


def can_pack8(weight: torch.Tensor) -> bool:
    """Whether the kernel can multiply this (N, K) int8 weight by int8 activations (`pack8`): K a multiple of 32."""
    return weight.dim() == 2 and weight.dtype == torch.int8 and weight.shape[1] % QBLOCK == 0


def pack8(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 -> (ceil(N / 16), K / 4, 16, 4), contiguous: panel p holds output columns 16p .. 16p + 15, each
    column's 4 weights of k = 4g .. 4g + 3 side by side (zeros past N), as few_rows.c's integer kernel reads them
    against x quantised to int8 in blocks of 32 (weight type 7; a draft's products only: its numbers are not the
    float32 path's)."""
    return _padded(weight).view(-1, 16, weight.shape[1] // 4, 4).transpose(1, 2).contiguous()


TILES = 8  # the kernel's weight type of `tile`'s packing


def amx() -> bool:
    """Whether this process can multiply on AMX tiles (the CPU has AMX-BF16 and AVX-512 BF16, and Linux gave the
    process the tiles' state; few_rows.c's few_rows_amx)."""
    lib = library()
    return lib is not None and lib.few_rows_amx() == 1


def can_tile(weight: torch.Tensor) -> bool:
    """Whether the kernel can read this (N, K) float32 weight on AMX tiles (`tile`): AMX here, K a multiple of 32."""
    return weight.dim() == 2 and weight.dtype == torch.float32 and weight.shape[1] % 32 == 0 and amx()


def tile(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) float32 -> (ceil(N / 16), 2, K / 32, 16, 32) bfloat16, contiguous: panel p of 16 output columns, the
    weights' hi part (rounded to nearest even) then lo part (the rest, rounded), chunk c of 32 k, row r holding
    k = 32c + 2r and 32c + 2r + 1 side by side for each column, as AMX pairs them (few_rows.c, weight type 8)."""
    w = _padded(weight)
    hi = w.to(torch.bfloat16)
    lo = (w - hi.float()).to(torch.bfloat16)
    n, k = w.shape
    parts = torch.stack([hi, lo]).view(2, n // 16, 16, k // 32, 16, 2)  # (part, p, column, c, r, pair)
    return parts.permute(1, 0, 3, 4, 2, 5).contiguous().view(n // 16, 2, k // 32, 16, 32)


def wtype_of(weight: torch.Tensor) -> int:
    """The kernel's weight type for a weight as stored: row-major (N, K), packed (N / 16, K, 16), packed for
    int8 activations (N / 16, K / 4, 16, 4), or on AMX tiles (N / 16, 2, K / 32, 16, 32)."""
    if weight.dim() == 5:
        return TILES
    if weight.dim() == 4:
        return ACT8
    return WTYPES[weight.dtype] + (PANELS if weight.dim() == 3 else 0)


def first_max(scores: torch.Tensor) -> torch.Tensor | None:
    """(..., n) float32 scores on the CPU, rows contiguous -> (...,) int64: each row's first index of its largest
    score, NaN never counting, or -1 where no score is above -inf (sampling.greedy's answer; csrc/greedy.c); None
    where the library is not here or the tensor is not such scores."""
    lib = library()
    if lib is None or scores.dtype != torch.float32 or scores.device.type != "cpu" or scores.dim() == 0:
        return None
    n = scores.shape[-1]
    rows = scores.reshape(-1, n) if n else None  # a view where the rows are laid out evenly; else a copy
    if rows is None or rows.stride(-1) != 1:
        return None
    out = torch.empty(rows.shape[0], dtype=torch.long)
    lib.first_max(rows.data_ptr(), rows.shape[0], n, rows.stride(0) if rows.shape[0] > 1 else n, out.data_ptr())
    return out.view(scores.shape[:-1])


def probs_at(scores: torch.Tensor, rows: list[int], cols: list[int]) -> list[float] | None:
    """scores (R, n) float32 on the CPU, rows contiguous -> [softmax(scores[rows[i]])[cols[i]] for each i], read as
    sampling.to_probs reads a row at T = 1 (csrc/llama.c's probs_at: each row's maximum and sum taken once, only the
    chosen entries' exponentials; two float32 softmaxes of one row differ by up to about 1e-5 relative, this and
    PyTorch's too); None where the library is not here, the tensor is not such scores, a row or column is out of
    range, there are more than PROBS_AT_MOST entries or a chosen row has no score above -inf (the caller's PyTorch path then
    says so)."""
    lib = library()
    if lib is None or scores.dtype != torch.float32 or scores.device.type != "cpu" or scores.dim() != 2:
        return None
    R, n = scores.shape
    if scores.stride(-1) != 1 or not 0 < len(rows) <= PROBS_AT_MOST or not (0 <= min(rows) and max(rows) < R):
        return None
    if not (0 <= min(cols) and max(cols) < n):
        return None
    at = torch.tensor([rows, cols], dtype=torch.long)
    out = torch.empty(len(rows))
    made = lib.probs_at(scores.data_ptr(), n, scores.stride(0), at[0].data_ptr(), at[1].data_ptr(), len(rows),
                        out.data_ptr())  # fmt: skip
    return out.tolist() if made == 0 else None


def few_rows(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None, n: int = 0) -> torch.Tensor:
    """x (M, K) float32 contiguous, weight (N, K) float32, float16, or int8 with scale (N,) float32 (row n of the
    product times scale[n]), or (N, K / 2) uint8 NF4 with scale (16 code values, then N K / 64 absmax) float32,
    or one of the first three packed in panels (`pack`; n: its N), or int8 packed for int8 activations (`pack8`,
    with its scale; n: its N), contiguous, 1 <= M <= MAX_ROWS -> (M, N) float32."""
    rows, k = x.shape
    n = n or weight.shape[0] * (16 if weight.dim() >= 3 else 1)
    y = torch.empty(rows, n, dtype=torch.float32)
    sc = scale.data_ptr() if scale is not None else None
    wtype = wtype_of(weight)
    failed = library().few_rows(weight.data_ptr(), wtype, sc, x.data_ptr(), rows, k, n, y.data_ptr(), cpus.threads())
    check(failed, "few_rows")
    return y


OUT_OF_MEMORY = "Out of memory while running the model; close other programs or load a smaller model."


def check(failed: int, what: str) -> None:
    """A native call's status (few_rows, llama_forward, llama_chain, llama_tree_read): -2 from few_rows or
    llama_forward, a product on the AMX tiles had no memory for its x (its columns NaN, not the model's numbers), and
    -3, a call had no memory for its buffers, are the user's out-of-memory sentence; -1, its arguments refused, is
    unreachable where the caller checks M and dtypes."""
    if failed in (-2, -3):
        raise SpecvizError(OUT_OF_MEMORY)
    if failed:
        raise RuntimeError(f"{what} refused its arguments")
