"""specviz/host/cpus.py: the CPUs a cgroup quota allows, read from fake cgroup trees, and the thread count fitted to
them (the numbers not changing with the thread count: tests/test_lean.py)."""

from __future__ import annotations

import pytest
import torch

from specviz.config import SpecvizError
from specviz.host import cpus
from specviz.native import panels as lean_panels


def _write(root, rel: str, name: str, text: str) -> None:
    folder = root.joinpath(*[p for p in rel.split("/") if p])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def _proc(tmp_path, text: str):
    f = tmp_path / "cgroup"
    f.write_text(text)
    return f


def test_a_v2_quota_is_read_from_the_processs_cgroup_and_the_smallest_on_its_way_up_counts(tmp_path):
    root = tmp_path / "fs"
    _write(root, "/kubepods/pod1/c1", "cpu.max", "150000 100000\n")
    _write(root, "/kubepods/pod1", "cpu.max", "max 100000\n")
    _write(root, "/", "cpu.max", "max 100000\n")
    proc = _proc(tmp_path, "0::/kubepods/pod1/c1\n")
    assert cpus.cpu_quota(root, proc) == 1.5
    _write(root, "/kubepods", "cpu.max", "100000 100000\n")  # a tighter limit above it
    assert cpus.cpu_quota(root, proc) == 1.0
    for f in ("kubepods/pod1/c1", "kubepods"):
        (root / f / "cpu.max").write_text("max 100000\n")
    assert cpus.cpu_quota(root, proc) is None


def test_a_container_that_sees_its_own_cgroup_as_the_root_reads_the_roots_files(tmp_path):
    root = tmp_path / "fs"
    _write(root, "/", "cpu.max", "200000 100000\n")  # the namespaced view: the path /proc names is not there
    assert cpus.cpu_quota(root, _proc(tmp_path, "0::/docker/abc\n")) == 2.0


def test_a_v1_quota_is_read_from_the_cpu_controllers_folder_and_minus_one_means_none(tmp_path):
    root = tmp_path / "fs"
    _write(root, "/cpu,cpuacct/docker/abc", "cpu.cfs_quota_us", "250000\n")
    _write(root, "/cpu,cpuacct/docker/abc", "cpu.cfs_period_us", "100000\n")
    proc = _proc(tmp_path, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cpus.cpu_quota(root, proc) == 2.5
    (root / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us").write_text("-1\n")
    assert cpus.cpu_quota(root, proc) is None


@pytest.mark.parametrize("text", ["", "garbage", "0::/a\n", "4:cpu:/x\n"])
def test_missing_or_unreadable_cgroup_files_mean_no_quota(tmp_path, text):
    root = tmp_path / "fs"
    _write(root, "/a", "cpu.max", "abc def\n")  # unparsable
    _write(root, "/cpu/x", "cpu.cfs_quota_us", "100000\n")  # no period beside it
    assert cpus.cpu_quota(root, _proc(tmp_path, text)) is None
    assert cpus.cpu_quota(root, tmp_path / "no-such-file") is None


@pytest.mark.parametrize(
    "quota, affinity, usable", [(None, 2, 2), (1.5, 16, 1), (2.0, 16, 2), (0.5, 16, 1), (4.0, 2, 2), (2.999, 8, 2)]
)
def test_the_usable_cpus_are_the_affinity_at_most_the_quota_rounded_down_and_at_least_one(quota, affinity, usable):
    assert cpus.cpus_for(quota, affinity) == usable


def test_the_thread_count_is_lowered_to_the_usable_cpus_unless_the_operator_set_one():
    assert cpus.threads_wanted(16, {}, usable=2) == (2, "2 CPUs usable (CPU quota or affinity), torch chose 16")
    assert cpus.threads_wanted(2, {}, usable=1)[0] == 1
    assert cpus.threads_wanted(1, {}, usable=2) == (1, "torch's default")  # never raised
    assert cpus.threads_wanted(2, {}, usable=2) == (2, "torch's default")
    assert cpus.threads_wanted(16, {"OMP_NUM_THREADS": "16"}, usable=2) == (16, "set by OMP_NUM_THREADS")
    assert cpus.threads_wanted(16, {"SPECVIZ_THREADS": "3"}, usable=2) == (3, "set by SPECVIZ_THREADS")
    assert cpus.threads_wanted(16, {"SPECVIZ_THREADS": "auto"}, usable=2)[0] == 2
    for bad in ("0", "two", "-1", "1.5"):
        with pytest.raises(SpecvizError, match="SPECVIZ_THREADS must be auto or a whole number"):
            cpus.threads_wanted(2, {"SPECVIZ_THREADS": bad}, usable=2)


def test_fit_threads_sets_torchs_count_once_and_says_why(monkeypatch):
    monkeypatch.setattr(cpus, "_fitted", None)
    monkeypatch.setenv("SPECVIZ_THREADS", "2")
    try:
        assert cpus.fit_threads() == "set by SPECVIZ_THREADS" and torch.get_num_threads() == 2
        assert cpus.fitted() == "set by SPECVIZ_THREADS"
        monkeypatch.setenv("SPECVIZ_THREADS", "1")
        assert cpus.fit_threads() == "set by SPECVIZ_THREADS" and torch.get_num_threads() == 2  # once a process
    finally:
        torch.set_num_threads(1)  # the suite's count (conftest)
        monkeypatch.setattr(cpus, "_fitted", None)
    assert cpus.fitted() == "torch's default"


STAT = """cpu  900 0 300 5000 100 0 0 0 0 0

cpu0 100 5 50 2000 40 1 2 7 0 0
cpu1 200 0 60 1000 60 0 3 0 0 0
cpu2 999 0 0 0 0 0 0 0 0 0
intr 12345
"""


def test_busy_ticks_count_the_affinity_cpus_lines_without_idle_or_iowait_and_with_steal(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    assert cpus.busy_jiffies({0}, stat) == 100 + 5 + 50 + 1 + 2 + 7
    assert cpus.busy_jiffies({0, 1}, stat) == 165 + 263
    assert cpus.busy_jiffies({0, 1}, tmp_path / "missing") is None


@pytest.mark.parametrize(
    "n, others, free", [(2, 0.0, 2), (2, 0.3, 2), (2, 0.6, 1), (2, 1.9, 1), (2, 3.0, 1), (4, 1.0, 3)]
)
def test_a_neighbour_that_keeps_most_of_a_cpu_busy_takes_a_thread(n, others, free):
    assert cpus.free_cpus(n, others) == free


def test_threads_follow_the_neighbours_load_only_where_specviz_chose_the_count(monkeypatch):
    """Ticks of another program's busy loop on one of two CPUs: auto runs one thread, and torch's own count on the
    asking thread follows (PyTorch's ops between the native calls); a forced count, or a quota's fit, is never
    lowered; never more than the fitted count."""
    clock = {"wall": 100.0, "busy": 0.0, "own": 0.0}
    n = cpus._Neighbours()
    n.cpus = {0, 1}
    monkeypatch.setattr(n, "sample", lambda: (clock["wall"], clock["busy"], clock["own"]))
    monkeypatch.setattr(cpus, "_NEIGHBOURS", n)
    monkeypatch.setattr(cpus.time, "monotonic", lambda: clock["wall"])

    def tick(others: float, own: float, s: float = 0.6) -> None:
        clock["wall"] += s
        clock["busy"] += (others + own) * s
        clock["own"] += own * s

    def both() -> tuple[int, int]:
        return cpus.threads(), torch.get_num_threads()

    try:
        cpus.follow_neighbours(2)
        assert both() == (2, 2)  # the first look only starts the window
        tick(others=0.95, own=1.0)
        assert both() == (1, 1)
        tick(others=0.1, own=2.0)
        assert both() == (2, 2)
        tick(others=0.9, own=1.0, s=0.2)  # within the window: no new look
        assert both() == (2, 2)
        tick(others=0.9, own=1.0, s=0.4)
        assert both() == (1, 1)
        cpus.follow_neighbours(1)
        tick(others=0.0, own=1.0)
        assert both() == (1, 1)  # never more than the fitted count
        cpus.follow_neighbours(2)
        torch.set_num_threads(1)  # by hand: the new most
        tick(others=0.0, own=1.0)
        assert both() == (1, 1)
        torch.set_num_threads(2)
        tick(others=1.9, own=0.1)  # the window since the last look (at 1 thread, none) spans both ticks: 0.95
        assert both() == (1, 1)
        tick(others=0.0, own=2.0)
        assert both() == (2, 2)
        cpus.follow_neighbours(None, 2)
        tick(others=1.5, own=0.5)
        assert both() == (2, 2)
        torch.set_num_threads(3)  # a count set by hand stays where nothing adapts
        assert both() == (3, 3)
    finally:
        monkeypatch.setattr(cpus, "_most", None)
        torch.set_num_threads(1)


@pytest.mark.parametrize(
    "env, quota, adaptive",
    [
        ({}, None, True),
        ({"SPECVIZ_THREADS": "2"}, None, False),
        ({"OMP_NUM_THREADS": "2"}, None, False),
        ({}, 2.0, False),
    ],
)
def test_only_specvizs_own_count_without_a_quota_follows_the_neighbours(monkeypatch, env, quota, adaptive):
    for k in ("SPECVIZ_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(cpus, "cpu_quota", lambda *a: quota)
    monkeypatch.setattr(cpus, "_fitted", None)
    monkeypatch.setattr(cpus, "_most", None)
    try:
        why = cpus.fit_threads()
        assert (cpus._most is not None) is adaptive
        assert why.endswith("fewer while other programs keep a CPU busy") is adaptive
    finally:
        torch.set_num_threads(1)
        monkeypatch.setattr(cpus, "_fitted", None)


def test_without_an_affinity_call_every_cpu_counts_and_without_proc_stat_nothing_adapts(monkeypatch, tmp_path):
    """macOS has neither sched_getaffinity nor /proc/stat: the package still imports, the fit uses os.cpu_count()
    and the thread count stays as set."""
    monkeypatch.delattr(cpus.os, "sched_getaffinity")
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 6)
    assert cpus.affinity() == set(range(6))
    n = cpus._Neighbours()
    monkeypatch.setattr(cpus, "busy_jiffies", lambda c: None)  # no /proc/stat
    assert n.update() is None and n.free == 6


def test_the_header_names_a_thread_count_specviz_lowered_or_the_operator_set(monkeypatch):
    monkeypatch.setattr(cpus, "_fitted", "torch's default, fewer while other programs keep a CPU busy")
    assert cpus.note() == ""
    monkeypatch.setattr(cpus, "_fitted", "1 CPU usable (CPU quota or affinity), torch chose 16")
    assert cpus.note() == "; threads: 1 CPU usable (CPU quota or affinity), torch chose 16"
    monkeypatch.setattr(cpus, "_fitted", "set by SPECVIZ_THREADS")
    assert cpus.note() == "; threads: set by SPECVIZ_THREADS"


def test_the_pairs_backend_line_names_the_thread_rule_once(loaded_pair, monkeypatch):
    from specviz.models.loaded import pair_backend

    p, q = loaded_pair
    monkeypatch.setattr(lean_panels, "_passes_timed", {})  # no kernel counts timed by an earlier test's model
    monkeypatch.setattr(cpus, "_fitted", "torch's default")
    plain = pair_backend(p, q)
    monkeypatch.setattr(cpus, "_fitted", "1 CPU usable (CPU quota or affinity), torch chose 2")
    assert pair_backend(p, q) == plain + "; threads: 1 CPU usable (CPU quota or affinity), torch chose 2"
