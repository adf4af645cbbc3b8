"""Real texts and word lists found on this machine, for build_prompts.py.

Nothing here downloads anything. The sources, in the order the builder prefers them:
  * Python's standard library: docstrings (prose to summarise, rewrite and answer from), the source of small
    pure-Python functions (code to explain, edit and test), module names and city names (zoneinfo);
  * installed packages' METADATA descriptions (importlib.metadata), cleaned of markdown and badges;
  * /usr/share/doc: READMEs and other plain-text documentation of the Debian packages.
Every list comes back sorted or in a fixed order, so a seeded builder gives the same prompts on the same
machine. A different Python or a different set of installed packages gives somewhat different texts.
"""

from __future__ import annotations

import gzip
import importlib
import importlib.metadata
import inspect
import re
import warnings
import zoneinfo
from pathlib import Path

# Modules imported for docstrings and code: plain, side-effect-free, present in every CPython 3.10+.
STDLIB = (
    "abc argparse ast base64 bisect calendar cmd codecs collections colorsys configparser contextlib copy csv "
    "dataclasses datetime decimal difflib dis email enum filecmp fileinput fnmatch fractions ftplib functools "
    "getopt gettext glob graphlib gzip hashlib heapq hmac html http imaplib inspect io ipaddress itertools json "
    "keyword linecache locale logging lzma mailbox math mimetypes netrc numbers operator optparse os pathlib "
    "pickle pkgutil platform plistlib poplib pprint profile pstats queue quopri random re reprlib sched secrets "
    "selectors shelve shlex shutil signal smtplib socket socketserver sqlite3 statistics string struct "
    "subprocess tarfile tempfile textwrap threading timeit token tokenize trace traceback types typing unittest "
    "urllib.parse urllib.request uuid warnings wave weakref webbrowser xml.dom.minidom xml.etree.ElementTree "
    "zipfile zlib"
).split()

_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")  # [text](url) -> text; images vanish below
_TAGS = re.compile(r"<[^>]+>|`+|\*\*|__|:\w+:")
_URL = re.compile(r"https?://\S+")


def prose_ok(text: str, min_words: int = 25, max_chars: int = 900) -> bool:
    """Looks like a paragraph of English prose: long enough, not too long, mostly letters, few symbols."""
    if not (min_words <= len(text.split()) and len(text) <= max_chars):
        return False
    letters = sum(c.isalpha() or c in " ,.;'-()" for c in text)
    return letters / len(text) > 0.9 and text[0].isupper() and text.rstrip()[-1] in ".!?)" and ">>>" not in text


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each folded onto one line, markup and URLs removed."""
    out, fence = [], False
    for block in re.split(r"\n\s*\n", text):
        lines = []
        for line in block.splitlines():
            s = line.strip()
            if s.startswith("```"):
                fence = not fence
                continue
            if (
                fence
                or s.startswith(("#", "|", "..", "=", "-" * 3, "*" * 3, ">>>", "$ ", "[!"))
                or line.startswith("    ")
            ):
                continue
            lines.append(s)
        para = _URL.sub("", _TAGS.sub("", _LINK.sub(r"\1", " ".join(lines))))
        para = " ".join(para.split())
        if para:
            out.append(para)
    return out


def _unique(items: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen, out = set(), []
    for src, text in items:
        key = " ".join(text.split()).casefold()
        if key not in seen:
            seen.add(key)
            out.append((src, text))
    return out


def _modules():
    for name in STDLIB:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                yield name, importlib.import_module(name)
            except Exception:  # a module this Python lacks is skipped
                continue


def docstring_texts() -> list[tuple[str, str]]:
    """(where, paragraph) from the docstrings of the standard-library modules above and their public members."""
    out = []
    for name, mod in _modules():
        objs = [(name, mod)] + [(f"{name}.{k}", v) for k, v in sorted(vars(mod).items()) if not k.startswith("_")]
        for where, obj in objs:
            if getattr(obj, "__module__", name) != name and obj is not mod:
                continue  # re-exported from elsewhere: counted where it is defined
            doc = inspect.getdoc(obj) if (inspect.isclass(obj) or inspect.isroutine(obj) or obj is mod) else None
            out.extend((where, p) for p in paragraphs(doc or "") if prose_ok(p))
    return _unique(out)


def package_texts() -> list[tuple[str, str]]:
    """(package, paragraph) from the long descriptions of the installed distributions."""
    out = []
    dists = {d.metadata["Name"]: d for d in importlib.metadata.distributions() if d.metadata["Name"]}
    for name in sorted(dists, key=str.casefold):
        meta = dists[name].metadata
        desc = meta.get_payload() or meta.get("Description") or ""
        out.extend((name, p) for p in paragraphs(desc) if prose_ok(p))
    return _unique(out)


def doc_texts(root: str | Path = "/usr/share/doc") -> list[tuple[str, str]]:
    """(file, paragraph) from READMEs and text files under /usr/share/doc (gzipped ones too)."""
    root, out = Path(root), []
    if not root.is_dir():
        return out
    pats = ("README*", "*.md", "*.md.gz", "*.txt", "*.txt.gz", "NEWS.Debian*")
    files = sorted({f for pat in pats for f in root.glob(f"*/{pat}") if f.is_file()})
    for f in files:
        try:
            raw = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
            text = raw[:200_000].decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        out.extend((str(f.relative_to(root)), p) for p in paragraphs(text) if prose_ok(p))
    return _unique(out)


def small_functions(min_lines: int = 4, max_lines: int = 22) -> list[tuple[str, str]]:
    """(module.function, source) of short public pure-Python functions in the standard library."""
    out = []
    for name, mod in _modules():
        for k, fn in sorted(vars(mod).items()):
            if k.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != mod.__name__:
                continue
            try:
                src = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
            lines = src.splitlines()
            if min_lines <= len(lines) <= max_lines and src.startswith("def ") and len(src) < 900:
                out.append((f"{name}.{k}", src.rstrip()))
    return _unique(out)


def stdlib_module_summaries() -> list[tuple[str, str]]:
    """(module, first line of its docstring) for the modules above."""
    out = []
    for name, mod in _modules():
        first = (inspect.getdoc(mod) or "").strip().split("\n")[0].strip().rstrip(".")
        if 3 <= len(first.split()) <= 16:
            out.append((name, first))
    return out


def cities() -> list[str]:
    """City names from the time-zone database (e.g. 'Buenos Aires'), sorted."""
    names = set()
    for tz in zoneinfo.available_timezones():
        parts = tz.split("/")
        if len(parts) >= 2 and parts[0] in {"Africa", "America", "Asia", "Australia", "Europe", "Pacific"}:
            names.add(parts[-1].replace("_", " "))
    return sorted(n for n in names if n.isascii() and len(n) > 2)
