"""How good are prompt-lookup guesses, by the length of the match, against the draft model's at the same place?

The code is specviz/training/lookup_stats.py (its docstring says how to run it; --help lists the options).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.training.lookup_stats import main  # noqa: E402

if __name__ == "__main__":
    main()
