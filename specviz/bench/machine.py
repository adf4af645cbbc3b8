"""The machine a measurement ran on: CPU model and vector units, GPU, threads, load and library versions.

The benchmark prints these beside its table and a recording (record.environment) stores them, so a reader can
judge timings taken elsewhere; nothing here measures.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

import torch

from specviz.host import cpus
from specviz.native import library as native


def machine_info() -> dict:
    """CPU model, GPU, threads and library versions: the facts a reader needs to compare numbers."""
    import transformers

    cpu = platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "vendor_id", "cpu family", "model", "flags"):
                fields.setdefault(key.strip(), value.strip())
            if not line.strip() and fields:
                break  # the first processor tells
    cpu = fields.get("model name", cpu)
    flags = set(fields.get("flags", "").split())
    vector = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16") if f in flags]
    load, quota = None, cpus.cpu_quota()
    with contextlib.suppress(OSError):
        load = Path("/proc/loadavg").read_text().split()[0]
    return {
        "cpu": cpu,
        "cpu_id": f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}",
        "cpu_vector": " ".join(vector) or "none of avx2/avx512",
        "cpu_count": os.cpu_count(),
        "load_avg_1min": load,  # the machine may be shared: read the numbers as ratios within one run
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        "cpu_quota": quota,  # CPUs the cgroup allows (None: no quota); threads are fitted to it
        "usable_cpus": cpus.cpus_for(quota, len(cpus.affinity())),
        "threads_why": cpus.fitted(),
        "kernel_passes": kernel_passes(),
        "panel_prefetch": native.panel_prefetch() if native.loaded() else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def kernel_passes() -> dict | None:
    """The AVX2 rows kernels' rows of W per pass for 1..8 tokens by weight type (native.passes), where the kernel is
    loaded and runs AVX2 (never built just to say so); else None."""
    if not native.loaded() or native.passes(0) is None:
        return None
    return {t: list(native.passes(w)) for t, w in (("float32", 0), ("float16", 1), ("int8", 2))}
