"""specviz web app: `python app.py` serves it on http://127.0.0.1:7860 (GRADIO_SERVER_NAME=0.0.0.0 for others).

Hugging Face Spaces runs this file. Importing it is cheap: the demo is built and the models load only in main().
Environment: SPECVIZ_TARGET / SPECVIZ_DRAFT pick the default pair; see specviz/limits.py for the caps.
"""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def main() -> None:
    from specviz.ui import build_demo, launch_kwargs

    build_demo().launch(**launch_kwargs())


if __name__ == "__main__":
    main()
