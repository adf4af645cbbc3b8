"""Build the prompt set for the teacher data: many distinct instructions over many kinds, none held out.

The code is specviz/training/build_prompts.py (its docstring says how to run it; --help lists the options).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.training.build_prompts import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
