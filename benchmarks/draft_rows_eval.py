"""Which rows of the built-in draft are worth computing: the draft's teacher-forced first guess on the greedy replies
of the teacher data's last tenth, its output restricted to the K rows whose target tokens are most frequent in the
other nine tenths ("freq", what specviz/training/draft_rows.py keeps), or to the K rows the draft itself guesses
most often there (every 8th reply; "argmax"). The figures behind draft_rows.KEEP (BENCHMARKS.md, "The draft's
output layer cut to the rows it proposes"); about 7 minutes on 2 cores.

    python benchmarks/draft_rows_eval.py        # writes runs/draft_rows_eval.json
"""

import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's specviz, from any folder
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from specviz.training.common import prompt_ids  # noqa: E402

torch.set_num_threads(2)
D = ROOT / "assets" / "draft"
model = AutoModelForCausalLM.from_pretrained(D, dtype=torch.float32).eval()
tok = AutoTokenizer.from_pretrained(D)
spec = json.load(open(f"{D}/specviz_vocab.json"))
tid = np.array(spec["target_ids"])
N = len(tid)
row = np.zeros(49152, dtype=np.int64)
row[tid] = np.arange(N)  # outside: row 0
inv = np.full(49152, -1)
inv[tid] = np.arange(N)
recs = [json.loads(line) for line in gzip.open(ROOT / "data" / "teacher.jsonl.gz", "rt")]
cut = int(len(recs) * 0.9)
freq = np.zeros(N, dtype=np.int64)
for r in recs[:cut]:
    v = inv[np.array(r["ids"])]
    np.add.at(freq, v[v >= 0], 1)
freq[0] = -1  # never proposed


def logits_of(r):
    p = prompt_ids(tok, r["prompt"])
    seq = torch.tensor(row[np.array(p + r["ids"])])
    with torch.inference_mode():
        z = model(seq[None]).logits[0, len(p) - 1 : -1]
        z[:, 0] = -torch.inf
    return z


t0 = time.time()
am = np.zeros(N, dtype=np.int64)
train = recs[:cut][::8]
for i, r in enumerate(train):
    a = logits_of(r).argmax(-1).numpy()
    np.add.at(am, a, 1)
    if i % 500 == 0:
        print("train", i, len(train), round(time.time() - t0), flush=True)
orders = {"freq": np.argsort(-freq, kind="stable"), "argmax": np.lexsort((-freq, -am))}
print("rows ever argmax on train subset", int((am > 0).sum()), flush=True)
Ks = [3000, 4000, 5000, 6000, 8000, 10000, 12000, N]
val = [r for r in recs[cut:] if r["temperature"] == 0.0]
hits = {(o, K): 0 for o in orders for K in Ks}
mass = {(o, K): 0.0 for o in orders for K in Ks}
tot = 0
for i, r in enumerate(val):
    z = logits_of(r).clone()
    y = torch.tensor(inv[np.array(r["ids"])])
    pr = torch.softmax(z, -1)
    for o, order in orders.items():
        for K in Ks:
            keep = torch.tensor(order[:K])
            a = keep[z[:, keep].argmax(-1)]
            hits[(o, K)] += int((a == y).sum())
            mass[(o, K)] += float(pr[:, keep].sum(-1).sum())
    tot += len(r["ids"])
    if i % 200 == 0:
        print("val", i, len(val), round(time.time() - t0), flush=True)
out = {
    "tokens": tot,
    "ever_argmax": int((am > 0).sum()),
    "rows": {f"{o}:{K}": {"acc": hits[(o, K)] / tot, "q_mass_kept": mass[(o, K)] / tot} for o in orders for K in Ks},
    "argmax_order": orders["argmax"].tolist(),
    "freq_order": orders["freq"].tolist(),
    "argmax_counts": am.tolist(),
}
json.dump(out, open(ROOT / "runs" / "draft_rows_eval.json", "w"))
for k, v in out["rows"].items():
    print(k, f"{v['acc']:.4f} {v['q_mass_kept']:.4f}")
