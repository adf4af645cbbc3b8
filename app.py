"""specviz web app: `python app.py` serves it on http://127.0.0.1:7860 (GRADIO_SERVER_NAME=0.0.0.0 for others).

Hugging Face Spaces runs this file. Importing it is cheap: the demo is built and the models load only in main().
Environment: SPECVIZ_TARGET / SPECVIZ_DRAFT pick the default pair; see specviz/limits.py for the caps, and
SPECVIZ_MALLOC_ARENAS / SPECVIZ_TRIM_S for the server's memory housekeeping (specviz/host/memory.py).
"""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def main() -> None:
    import logging

    from specviz.config import env_int
    from specviz.host import memory
    from specviz.ui import build_demo, launch_kwargs

    log = logging.getLogger("specviz")  # the operator's lines (memory, load failures) go to stderr
    log.setLevel(logging.INFO)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s specviz %(message)s"))
    log.addHandler(handler)
    memory.start(arenas=env_int("SPECVIZ_MALLOC_ARENAS", 2), every_s=env_int("SPECVIZ_TRIM_S", 60))
    build_demo().launch(**launch_kwargs())


if __name__ == "__main__":
    main()
