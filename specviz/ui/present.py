"""Presenting: a presentation mode for projectors and phones, and keys for the main buttons.

Presentation mode (the switch in the header, the key P, or `?present=1` in the address) puts the class
`sv-present` on the page: larger type and stronger contrast (assets/style.css). Keys, when the cursor is not in
a text field: R runs (Run race, Play, Check my prediction), S or Escape stops, N plays the next round, P switches
presentation mode. Each acts on the button of that name in the tab on screen.
"""

from __future__ import annotations

import gradio as gr

KEYS_HELP = "Keys: R run · S stop · N next round · P presentation mode"

# runs once when the header loads; `element` is the gr.HTML's own node
KEYS_JS = r"""
const want = {r: /^(Run race|Play|Check my prediction)/, s: /^Stop$/, escape: /^Stop$/, n: /^Next round/};
const visible = (b) => b.offsetParent !== null && !b.disabled;
const press = (re) => {
  const b = [...document.querySelectorAll('button')].find((x) => visible(x) && re.test(x.innerText.trim()));
  if (b) { b.click(); return true; }
  return false;
};
const setPresent = (on) => {
  document.body.classList.toggle('sv-present', on);
  const box = document.querySelector('#sv-present input[type=checkbox]');
  if (box && box.checked !== on) box.click();
};
if (!window.svKeys) {
  window.svKeys = true;
  document.addEventListener('keydown', (e) => {
    const t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName))) {
      if (!(t.type === 'checkbox' || t.type === 'radio' || t.type === 'range')) return;
    }
    const k = e.key.toLowerCase();
    if (k === 'p') { setPresent(!document.body.classList.contains('sv-present')); e.preventDefault(); return; }
    if (want[k] && press(want[k])) e.preventDefault();
  });
  if (new URLSearchParams(location.search).get('present') === '1') setTimeout(() => setPresent(true), 300);
}
"""
TOGGLE_JS = "(on) => { document.body.classList.toggle('sv-present', on === true); return on; }"


def build_present_controls() -> gr.Checkbox:
    """The presentation-mode switch and the page's keys (called inside the header row)."""
    box = gr.Checkbox(False, label="Presentation mode", elem_id="sv-present", scale=0, min_width=180)
    gr.HTML(f'<span class="sv-keys">{KEYS_HELP}</span>', js_on_load=KEYS_JS, elem_id="sv-keys")
    box.change(None, box, None, js=TOGGLE_JS, api_visibility="private", queue=False)
    return box
