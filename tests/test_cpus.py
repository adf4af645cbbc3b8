"""specviz/cpus.py: the CPUs a cgroup quota allows, read from fake cgroup trees, and the thread count fitted to
them (the numbers not changing with the thread count: tests/test_lean.py)."""

from __future__ import annotations

import pytest
import torch

from specviz import cpus
from specviz.config import SpecvizError


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
