"""What a run looks like, without gradio: `render` (the lanes as HTML, every token coloured by its fate), `plots`
(the race's figures) and `metrics` (events as pandas tables). Imports engine and below.
"""
