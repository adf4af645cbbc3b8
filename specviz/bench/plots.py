"""The benchmark's figures: speedup and acceptance per configuration, written as HTML (and PNG where kaleido can).

They draw the table of bench_summary.summarise_runs; nothing here measures.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd

COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")  # Okabe-Ito: one per temperature


def _figures(table: pd.DataFrame) -> dict:
    """Speedup and acceptance per configuration: one colour per temperature; transformers' peers as lines."""
    import plotly.graph_objects as go

    speed, accept = go.Figure(), go.Figure()
    for i, (t, cell) in enumerate(table.groupby("temperature")):
        colour = COLOURS[i % len(COLOURS)]
        speed.add_bar(x=cell["config"], y=cell["speedup_vs_ar"], name=f"specviz / plain, T={t:g}", marker_color=colour)
        for col, name, dash in (
            ("hf_assist_vs_ar", "transformers assisted (defaults)", "dash"),
            ("hf_lookup_vs_ar", "transformers prompt lookup", "dot"),
        ):
            v = cell[col].median()
            if pd.notna(v):
                speed.add_hline(
                    y=v,
                    line={"color": colour, "dash": dash, "width": 1.5},
                    annotation_text=f"{name}, T={t:g}: {v:.2f}x",
                )
        accept.add_bar(x=cell["config"], y=cell["alpha"], name=f"alpha (per token), T={t:g}", marker_color=colour)
        accept.add_bar(
            x=cell["config"],
            y=cell["acceptance"],
            name=f"accepted / drafted, T={t:g}",
            marker_color=colour,
            opacity=0.45,
        )
    speed.add_hline(y=1.0, line={"color": "grey", "width": 1})
    speed.update_layout(title="Speedup over plain decoding by configuration", yaxis_title="speedup", barmode="group")
    accept.update_layout(
        title="Acceptance by configuration: per token (alpha) and of all drafted tokens",
        yaxis_title="acceptance",
        yaxis={"range": [0, 1]},
        barmode="group",
    )
    return {"speedup": speed, "acceptance": accept}


def write_plots(table: pd.DataFrame, folder: str | Path) -> tuple[list[str], str | None]:
    """HTML always; PNG where kaleido finds a Chrome (Debian's chromium is tried). Returns (files, note)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files, note = [], None
    if not os.environ.get("BROWSER_PATH"):
        for chrome in ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"):
            if Path(chrome).is_file():
                os.environ["BROWSER_PATH"] = chrome  # where kaleido 1.x (choreographer) looks for a browser
                break
    for name in ("kaleido", "choreographer", "logistro"):  # their progress chatter is not ours to print
        logging.getLogger(name).setLevel(logging.WARNING)
    for name, fig in _figures(table).items():
        html = folder / f"{name}.html"
        fig.write_html(html, include_plotlyjs=True)  # self-contained: opens offline
        files.append(str(html))
        if note is None and os.environ.get("SPECVIZ_BENCH_PNG", "1") != "0":
            try:
                png = folder / f"{name}.png"
                fig.write_image(png, width=900, height=500)
                files.append(str(png))
            except Exception as e:  # kaleido raises many types when no browser runs; HTML is enough then
                note = f"PNG export unavailable ({type(e).__name__}: {str(e).splitlines()[0][:120]}); HTML written."
    return files, note
