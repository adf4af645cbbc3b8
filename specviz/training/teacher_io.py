"""Reading and appending teacher data safely, and the compact top-k format.

Teacher files are JSON lines, plain or gzip. The generator appends one gzip member per batch, so a run
killed mid-write leaves at most one truncated member at the end: `read_jsonl` stops quietly there, and
`repair_tail` cuts it off before the next run appends (otherwise the next member would be read as part of
the broken one).

Top-k records (in the numbered parts `*.topk.000.jsonl.gz`, `*.topk.001.jsonl.gz`, ... next to the teacher
file, `topk_parts`) carry, for every generated position t of a reply, the K most likely next tokens under the
target p (temperature 1, before any sampling temperature) and their probabilities:
    {"prompt", "temperature", "ids": [T ints], "k": K,
     "top_ids": base64 of uint16 little-endian, shape (T, K), most likely first,
     "top_p8":  base64 of uint8, shape (T, K), u = round(-20 * ln p) clipped to 255, so p = exp(-u / 20)}
Row t is p(. | prompt, ids[:t]), the distribution ids[t] was drawn from. The quantisation keeps p to within
2.5 % (relative) down to p = 3e-6; probabilities below that read as 3e-6. About 3 bytes per (position,
candidate) before gzip. `decode_topk(row)` gives the two arrays back as tensors.
"""

from __future__ import annotations

import base64
import glob
import gzip
import hashlib
import json
import math
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch

P8_SCALE = 20.0  # u = round(-P8_SCALE * ln p)


def read_jsonl(path: str | Path) -> Iterator[dict]:
    """Every complete JSON line of `path` (.gz or plain); a truncated gzip tail or a cut line is skipped."""
    path = Path(path)
    if not path.is_file():
        return
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        while True:
            try:
                line = f.readline()
            except (EOFError, OSError, zlib.error):  # the last gzip member was cut short by a kill
                return
            if not line:
                return
            try:
                yield json.loads(line)
            except json.JSONDecodeError:  # a line cut short: the run that resumes redoes it
                continue


def repair_tail(path: str | Path) -> int:
    """Cut an incomplete last gzip member (or an unterminated last line) off `path`; returns bytes removed."""
    path = Path(path)
    if not path.is_file():
        return 0
    data = path.read_bytes()
    if path.suffix != ".gz":
        good = data.rfind(b"\n") + 1
    else:
        good = pos = 0
        while pos < len(data):  # walk the members; `good` is the end of the last complete one
            d = zlib.decompressobj(wbits=31)
            try:
                d.decompress(data[pos:])
            except zlib.error:
                break
            if not d.eof:
                break
            pos = len(data) - len(d.unused_data)
            good = pos
    if good < len(data):
        with open(path, "r+b") as f:
            f.truncate(good)
    return len(data) - good


def append_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Append rows in one write (one gzip member for .gz)."""
    path = Path(path)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if path.suffix == ".gz":
        with open(path, "ab") as f:
            f.write(gzip.compress(text.encode("utf-8"), mtime=0))
    else:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)


def reply_key(row: dict) -> str:
    """One reply's identity, (prompt, temperature, ids), as a short hash: matches a reply to its top-k line."""
    raw = json.dumps([row["prompt"], float(row.get("temperature", 1.0)), list(row["ids"])])
    return hashlib.sha1(raw.encode("utf-8")).hexdigest()


def encode_topk(top_ids: torch.Tensor, top_p: torch.Tensor) -> dict:
    """(T, K) token ids and their probabilities -> the compact fields of a top-k record."""
    u = (-P8_SCALE * top_p.double().clamp_min(1e-30).log()).round().clamp(0, 255).to(torch.uint8)
    ids16 = top_ids.to(torch.int32).numpy().astype("<u2")
    return {
        "k": int(top_ids.shape[1]),
        "top_ids": base64.b64encode(ids16.tobytes()).decode("ascii"),
        "top_p8": base64.b64encode(u.numpy().tobytes()).decode("ascii"),
    }


def decode_topk(row: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """A top-k record -> (ids (T, K) long, p (T, K) float32)."""
    import numpy as np

    k = row["k"]
    ids = np.frombuffer(base64.b64decode(row["top_ids"]), dtype="<u2").astype("int64").reshape(-1, k)
    u = np.frombuffer(base64.b64decode(row["top_p8"]), dtype="uint8").reshape(-1, k)
    return torch.from_numpy(ids), torch.from_numpy(u.astype("float32")).div(-P8_SCALE).exp()


def _topk_stem(out: str | Path) -> tuple[Path, str, str]:
    out = Path(out)
    for ext in (".jsonl.gz", ".jsonl", ".gz"):
        if out.name.endswith(ext):
            return out.parent, out.name[: -len(ext)], ext
    return out.parent, out.name, ""


def topk_parts(out: str | Path) -> list[Path]:
    """The top-k files beside a teacher file, in order: data/teacher.jsonl.gz -> data/teacher.topk.000.jsonl.gz,
    data/teacher.topk.001.jsonl.gz, ... (numbered parts keep every file well under a git host's size limit)."""
    folder, stem, ext = _topk_stem(out)
    return sorted(folder.glob(f"{glob.escape(stem)}.topk.[0-9][0-9][0-9]{ext}"))


def topk_part(out: str | Path, max_bytes: int) -> Path:
    """The part to append the next top-k record to: the last one while it is under `max_bytes`, else a new one."""
    parts = topk_parts(out)
    if parts and parts[-1].stat().st_size < max_bytes:
        return parts[-1]
    folder, stem, ext = _topk_stem(out)
    return folder / f"{stem}.topk.{len(parts):03d}{ext}"


def p8_error() -> float:
    """Largest relative error of the quantised probabilities (half a step of the log grid)."""
    return math.exp(0.5 / P8_SCALE) - 1
