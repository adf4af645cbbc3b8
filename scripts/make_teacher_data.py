"""Generate teacher data for the built-in draft: the target's own replies to a broad set of instructions.

The code is specviz/training/make_teacher_data.py (its docstring says how to run it; --help lists the options).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.training.make_teacher_data import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
