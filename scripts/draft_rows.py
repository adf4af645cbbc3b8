"""Choose the rows a trimmed draft may propose: the target tokens its training replies hold most often.

The code is specviz/training/draft_rows.py (its docstring says how to run it; --help lists the options).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.training.draft_rows import main  # noqa: E402

if __name__ == "__main__":
    main()
