"""How many CPUs this process may use, and torch's thread count fitted to them before the first model loads.

Why: a container's CPU limit is a quota (cgroup `cpu.max`, or `cpu.cfs_quota_us` / `cpu.cfs_period_us`), not a
smaller machine. Inside it `os.cpu_count()` and the affinity mask still show every CPU of the host (a Hugging Face
Space with 2 vCPUs has been reported to show 16), and torch starts one thread per core it sees. The models' calls
split every product over those threads with a barrier between steps (csrc/llama.c: about 300 a forward of the
built-in target), so once the threads outnumber the quota the process is stopped for part of every period and each
barrier waits for a stopped thread: in a cgroup allowed one CPU, plain decoding on two threads runs clearly slower
than on one. So the thread count is at most the CPUs the quota allows, rounded down (1.5 CPUs
run one thread unthrottled rather than two throttled a quarter of the time), and at most the CPUs in the affinity
mask. The thread count never changes the numbers: llama.c and few_rows.c split a product's output columns and a
step's rows or heads between threads, each computed whole by one.

The same barriers make a busy neighbour costly where there is no quota: a program that keeps one of two cores busy
stops one of the two threads for a scheduler slice at a time, and every barrier waits for it, so two threads beside
a busy loop run slower than one. So without a quota
the native calls (llama.c, few_rows.c) take `threads()`: the fitted count less the CPUs other programs kept busy
over the last half second (/proc/stat for the CPUs of the affinity mask, less this process's own CPU time; a
hypervisor's steal counts as busy), looked at most twice a second. Torch's own count follows it (set by `threads()`
on the thread that asks), since PyTorch's OpenMP regions wait at the same kind of barrier: a sampled round's
49,152-wide probability rows, draws and scatters ran on 2 threads beside the native calls' 1, and with a browser
drawing the race on one of two cores a sampled draft step took several times as long.

SPECVIZ_THREADS: a number forces that many threads, always; unset (or `auto`), the fit above and the neighbours'
share, unless OMP_NUM_THREADS is set (then torch's count is the operator's, as OpenMP programs take it).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from pathlib import Path

import torch

from specviz.config import SpecvizError

CGROUP = Path("/sys/fs/cgroup")
SELF = Path("/proc/self/cgroup")
STAT = Path("/proc/stat")
WINDOW_S = 0.5  # how often threads() looks at the neighbours' load
_fitted: str | None = None
_most: int | None = None  # the fitted count threads() lowers for busy neighbours; None: a fixed count


def _v2(folder: Path) -> float | None:
    """CPUs allowed by a cgroup v2 folder's cpu.max ("max 100000": none; "200000 100000": 2.0)."""
    quota, period = (folder / "cpu.max").read_text().split()[:2]
    return None if quota == "max" else int(quota) / int(period)


def _v1(folder: Path) -> float | None:
    """CPUs allowed by a cgroup v1 cpu folder (cfs_quota_us -1: none)."""
    quota = int((folder / "cpu.cfs_quota_us").read_text())
    return None if quota <= 0 else quota / int((folder / "cpu.cfs_period_us").read_text())


def cpu_quota(root: Path = CGROUP, self_cgroup: Path = SELF) -> float | None:
    """CPUs this process's cgroups allow (the smallest quota on the way from its cgroup up to the root, v1 or v2),
    or None where none is set or nothing can be read. A container usually sees its own cgroup as the root, so
    both the path /proc names and the root are looked at."""
    found: list[float] = []
    with contextlib.suppress(OSError):
        lines = self_cgroup.read_text().splitlines()
        for line in lines:
            if line.count(":") < 2:
                continue
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                bases, read = [root, root / "unified"], _v2
            elif "cpu" in controllers.split(","):
                bases, read = [root / controllers, root / "cpu", root / "cpu,cpuacct"], _v1
            else:
                continue
            parts = Path(path.lstrip("/")).parts
            for base in dict.fromkeys(bases):
                for depth in range(len(parts), -1, -1):
                    with contextlib.suppress(OSError, ValueError, IndexError, ZeroDivisionError):
                        q = read(base.joinpath(*parts[:depth]))
                        if q is not None and q > 0:
                            found.append(q)
    return min(found) if found else None


def cpus_for(quota: float | None, affinity: int) -> int:
    """The CPUs worth a thread: those in the affinity mask, at most the quota rounded down, at least 1."""
    return max(1, min(affinity, math.floor(quota + 1e-9) if quota else affinity))


def affinity() -> set[int]:
    """The CPUs this process may run on (every CPU where the system cannot say: macOS, Windows)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def usable_cpus() -> int:
    """cpus_for this process's quota and affinity mask."""
    return cpus_for(cpu_quota(), len(affinity()))


def threads_wanted(current: int, env: dict | None = None, usable: int | None = None) -> tuple[int, str]:
    """(threads to run, why in words) from SPECVIZ_THREADS, OMP_NUM_THREADS and the usable CPUs."""
    env = os.environ if env is None else env
    raw = env.get("SPECVIZ_THREADS", "").strip().lower()
    if raw not in ("", "auto"):
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise SpecvizError(f"SPECVIZ_THREADS must be auto or a whole number of at least 1, not {raw!r}.")
        return n, "set by SPECVIZ_THREADS"
    if env.get("OMP_NUM_THREADS", "").strip():
        return current, "set by OMP_NUM_THREADS"
    usable = usable_cpus() if usable is None else usable
    if current > usable:
        return usable, f"{usable} CPU{'s' if usable != 1 else ''} usable (CPU quota or affinity), torch chose {current}"
    return current, "torch's default"


def fit_threads() -> str:
    """Set torch's thread count once per process (threads_wanted) and whether `threads()` may lower it for busy
    neighbours; returns why, in words. The models' calls ask `threads()` each time, so everything after this
    runs with the fitted count."""
    global _fitted
    if _fitted is None:
        quota = cpu_quota()
        n, why = threads_wanted(torch.get_num_threads(), usable=cpus_for(quota, len(affinity())))
        adaptive = not why.startswith("set by") and quota is None and _NEIGHBOURS.update() is not None
        follow_neighbours(n if adaptive else None, n)
        _fitted = why + (", fewer while other programs keep a CPU busy" if adaptive else "")
    return _fitted


def follow_neighbours(most: int | None, fixed: int = 1) -> None:
    """Let `threads()` run up to `most` threads, fewer for busy neighbours; None: always `fixed`. Torch's count is
    set to the one or the other on the calling thread (OpenMP's count is per thread; a thread that has not used
    torch yet starts from the last count set anywhere)."""
    global _most
    _most = most
    _asked.n = fixed if most is None else most
    torch.set_num_threads(_asked.n)


def fitted() -> str:
    """Why torch runs the threads it runs (fit_threads' answer), or "torch's default" before any model loaded."""
    return _fitted or "torch's default"


def note() -> str:
    """ "; threads: <why>" where specviz lowered torch's count for a quota or the operator set it (for the page
    header and the bench's "On this CPU" line), else nothing."""
    why = fitted()
    return "" if why.startswith("torch's default") else f"; threads: {why}"


def busy_jiffies(cpus: set[int], stat: Path = STAT) -> int | None:
    """Clock ticks the given CPUs spent on anything but idle and iowait since boot (/proc/stat), or None."""
    total = 0
    with contextlib.suppress(OSError, ValueError):
        for line in stat.read_text().splitlines():
            name, *fields = line.split() or [""]
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
                total += sum(ticks) - ticks[3] - ticks[4]
        return total
    return None


def others_between(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """CPUs other programs kept busy between two _Neighbours samples (wall, busy seconds, own seconds)."""
    wall, busy, own = (a - b for a, b in zip(after, before))
    return max(0.0, busy - own) / wall if wall > 0 else 0.0


def free_cpus(cpus: int, others: float) -> int:
    """Threads worth running on `cpus` CPUs while other programs keep `others` of them busy (at least 1)."""
    return max(1, min(cpus, math.floor(cpus - others + 0.5)))


class _Neighbours:
    """Other programs' CPU use over the last window: the affinity CPUs' busy ticks less this process's CPU time."""

    def __init__(self) -> None:
        self.cpus = affinity()
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.last: tuple[float, float, float] | None = None  # (wall, busy seconds, own seconds)
        self.free = len(self.cpus)

    def sample(self) -> tuple[float, float, float] | None:
        busy = busy_jiffies(self.cpus)
        if busy is None:
            return None
        own = os.times()
        return time.monotonic(), busy / self.tick, own.user + own.system

    def update(self) -> int | None:
        """The threads worth running now (None where /proc/stat cannot be read); starts the next window."""
        now = self.sample()
        if now is not None and self.last is not None and now[0] > self.last[0]:
            self.free = free_cpus(len(self.cpus), others_between(self.last, now))
        self.last = now
        return None if now is None else self.free


_NEIGHBOURS = _Neighbours()
_asked = threading.local()  # .n: the count threads() or follow_neighbours last set on this thread


def threads() -> int:
    """Threads for the next native call: torch's count, or where the count is specviz's own choice (fit_threads)
    and no quota applies, the fitted count less the CPUs other programs kept busy over the last WINDOW_S; torch's
    count on this thread is set to match, so PyTorch's ops between the native calls run as many. A count set by
    hand (torch.set_num_threads) since this thread's last call becomes the most it runs."""
    global _most
    now = torch.get_num_threads()
    if _most is None:
        return now
    if now != getattr(_asked, "n", now):
        _most = now
    if _most > 1 and (_NEIGHBOURS.last is None or time.monotonic() - _NEIGHBOURS.last[0] >= WINDOW_S):
        _NEIGHBOURS.update()
    n = _asked.n = min(_most, _NEIGHBOURS.free)
    if n != now:
        torch.set_num_threads(n)
    return n
