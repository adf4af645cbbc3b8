"""Train a feature-level draft head (EAGLE-style, specviz/models/head.py) on the target's cached features.

The code is specviz/training/train_head.py (its docstring says how to run it; --help lists the options).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.training.train_head import main  # noqa: E402

if __name__ == "__main__":
    main()
