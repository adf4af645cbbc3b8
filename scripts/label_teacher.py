"""Teacher-force the target over existing teacher replies: its top-k soft labels and (optionally) its features.

The code is specviz/training/label_teacher.py (its docstring says how to run it; --help lists the options).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.training.label_teacher import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
