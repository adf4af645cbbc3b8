"""Train specviz's built-in draft q for the target p (SmolLM2-135M-Instruct) from the target's own replies.

The code is specviz/training/train_draft.py (its docstring says how to run it; --help lists the options).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.training.train_draft import main  # noqa: E402

if __name__ == "__main__":
    main()
