"""Measure a draft q against the target p on held-out prompts: greedy acceptance alpha and cost ratio c.

The code is specviz/training/eval_draft.py (its docstring says how to run it; --help lists the options).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.training.eval_draft import main  # noqa: E402

if __name__ == "__main__":
    main()
