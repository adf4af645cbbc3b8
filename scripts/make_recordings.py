"""The recordings shipped in assets/recordings, made with the built-in pair on this machine (offline).

    .venv/bin/python scripts/make_recordings.py [--out assets/recordings] [--tag cpu]

Run it again after a change to the events (a recording keeps every event field) or on a GPU machine with
--tag gpu to add recordings made there. The Replay tab lists every .json file in assets/recordings.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz import load_pair, record_run  # noqa: E402
from specviz.api import encode_prompt  # noqa: E402
from specviz.recording.record import RECORDINGS_DIR, environment, make, settings_of  # noqa: E402
from specviz.teach.compute import Stepper, StepSettings  # noqa: E402


def step_session(prompt: str, gamma: int, temperature: float, seed: int, tokens: int):
    p, q = load_pair()
    st = Stepper(p, q, encode_prompt(p, prompt), StepSettings(prompt, gamma, temperature, seed, tokens))
    while st.advance() is not None:
        pass
    lanes = {"spec": [st.start, *st.rounds, st.done]}
    return make("step", settings_of(prompt, st.config), lanes, p.tokenizer, environment(p, q))


def sweep(prompt: str, tokens: int):
    from specviz.limits import Limits
    from specviz.ui.common import UIContext
    from specviz.ui.sweep import sweep_stream

    ctx = UIContext(limits=Limits(request_timeout_s=3600))  # a busy machine must not cut the sweep short
    gen = sweep_stream(ctx, prompt, 0.0, 0, 1.0, tokens, 0)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            result = stop.value
            break
    from specviz.ui.keep import sweep_recording

    if result is None:
        raise SystemExit("The sweep failed; run it in the app to see why.")
    return sweep_recording(ctx, result, prompt)


class _Lessons:
    """The Learn tab's lessons run on the built-in pair, saved as assets/recordings/lessons.json."""

    def save(self, path: Path) -> Path:
        from specviz.teach import lessons

        p, q = load_pair()
        lessons.save_recorded([lessons.run(ls, p, q) for ls in lessons.LESSONS], environment(p, q))
        return lessons.LESSONS_FILE


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RECORDINGS_DIR))
    ap.add_argument("--tag", default="cpu", help="a word for the machine, put in each file name")
    ap.add_argument("--only", default="", help="comma-separated names to make (default: all)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = {
        # the page's defaults (lookup+model, gamma auto): what a visitor's first race runs
        f"race-gravity-greedy-{a.tag}": lambda: record_run(
            "Tell me about gravity.", drafter="lookup+model", gamma="auto", max_new_tokens=96
        ),
        f"race-fibonacci-t0.7-{a.tag}": lambda: record_run(
            "def fibonacci(n):", drafter="lookup+model", gamma="auto", temperature=0.7, max_new_tokens=96, seed=1
        ),
        f"step-ai-t1.0-{a.tag}": lambda: step_session("What is AI?", 4, 1.0, 0, 48),
        f"sweep-gravity-greedy-{a.tag}": lambda: sweep("Tell me about gravity.", 64),
        "lessons": _Lessons,
    }
    only = {s for s in a.only.split(",") if s}
    for name, job in jobs.items():
        if only and not any(name.startswith(o) for o in only):
            continue
        path = job().save(out / f"{name}.json")
        print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
