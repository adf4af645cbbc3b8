"""The command line: python -m specviz setup | generate | check | bench | export-draft  (each with --json)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def _model_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--target", help="Hugging Face id or folder (default: the built-in SmolLM2-135M-Instruct)")
    ap.add_argument("--draft", help="Hugging Face id or folder (default: the built-in specviz draft)")
    ap.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: the best available)")
    ap.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16"], default=None)
    ap.add_argument("--quantize", choices=["4bit", "8bit"], default=None, help="load the target with bitsandbytes")
    ap.add_argument("--json", action="store_true", help="print one JSON object for machines")


def _gamma(text: str):
    return "auto" if text.strip().lower() == "auto" else int(text)


def _sampling_args(ap: argparse.ArgumentParser) -> None:
    """A run's options; each left unset stays unset, so the run gets request.RunRequest's default (named here)."""
    from specviz.config import DRAFTERS, GAMMA_POLICIES
    from specviz.request import RunRequest

    def d(name: str) -> str:
        return f"default {RunRequest.default(name)}"

    ap.add_argument("--drafter", choices=DRAFTERS, help=f"where guesses come from ({d('drafter')})")
    ap.add_argument("--gamma", type=_gamma, help=f"tokens proposed per round (1-16), or auto ({d('gamma')})")
    ap.add_argument("--gamma-policy", choices=GAMMA_POLICIES, help=f"how gamma changes per round ({d('gamma_policy')})")
    ap.add_argument(
        "--tree",
        help=f"token trees from the draft model: off (chains), a node budget 1-32, or auto; depth <= gamma ({d('tree')})",
    )
    ap.add_argument("--confidence", type=float, help=f"the confidence policy's threshold ({d('confidence')})")
    ap.add_argument(
        "--prompt-lookup-num-tokens", type=int, help=f"lookup: most tokens per match ({d('prompt_lookup_num_tokens')})"
    )
    ap.add_argument(
        "--max-matching-ngram-size",
        type=int,
        help=f"lookup: longest suffix tried first ({d('max_matching_ngram_size')})",
    )
    ap.add_argument("--head", help="the head drafters' head folder (default: the built-in target's)")
    ap.add_argument("--temperature", type=float, help=f"0 is greedy ({d('temperature')})")
    ap.add_argument("--top-k", type=int, help=f"0 is off ({d('top_k')})")
    ap.add_argument("--top-p", type=float, help=f"1 is off ({d('top_p')})")
    ap.add_argument("--max-new-tokens", type=int, help=f"({d('max_new_tokens')})")
    ap.add_argument("--seed", type=int, help=f"({d('seed')})")


def parser() -> argparse.ArgumentParser:
    from specviz.config import CHECK_DRAFTERS, DRAFTERS
    from specviz.request import RunRequest

    prog = "specviz" if os.path.basename(sys.argv[0]) == "specviz" else "python -m specviz"  # the installed command
    ap = argparse.ArgumentParser(prog=prog, description="See, teach and judge speculative decoding.")
    sub = ap.add_subparsers(dest="command", required=True)

    sub.add_parser("setup", help="prepare the built-in pair (converts the target once, offline afterwards)")

    g = sub.add_parser("generate", help="decode one prompt, speculatively or plainly")
    g.add_argument("prompt")
    g.add_argument("--mode", choices=["spec", "ar"], help=f"(default {RunRequest.default('mode')})")
    g.add_argument("--compare", action="store_true", help="run plain and speculative decoding and print the speedup")
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--record", metavar="RUN.json", help="also save the run (every event, timed) as a recording")
    g.add_argument("--tokenizer", help="a served --target's tokenizer: hub id or folder (default: the server's model)")
    _sampling_args(g)
    _model_args(g)

    c = sub.add_parser("check", help="can these two models be paired, and is it worth it?")
    _model_args(c)
    c.add_argument("--max-new-tokens", type=int, default=32, help="tokens per sample prompt when measuring")
    c.add_argument("--drafter", choices=CHECK_DRAFTERS, default="model", help="where guesses come from")
    c.add_argument("--tokenizer", help="a served --target's tokenizer: hub id or folder (default: the server's model)")

    x = sub.add_parser(
        "export-draft", help="write a trimmed draft with the target's full vocabulary, as engines load it"
    )
    x.add_argument("folder", help="a new or empty folder (a standard transformers model folder is written there)")
    x.add_argument("--draft", help="a trimmed draft's folder (default: the built-in specviz draft)")
    x.add_argument(
        "--target", help="whose vocabulary size to take (default: the built-in target for the built-in draft)"
    )
    x.add_argument("--json", action="store_true", help="print one JSON object for machines")

    r = sub.add_parser("replay", help="read a recording (no model needed): summarise it, export it as HTML")
    r.add_argument("recording", help="a JSON recording (from --record or the app's download button)")
    r.add_argument("--html", metavar="RUN.html", help="write a self-contained HTML page that opens offline")
    r.add_argument("--json", action="store_true", help="print one JSON object for machines")

    b = sub.add_parser("bench", help="measure speedup against plain decoding and transformers' assisted generation")
    _model_args(b)
    b.add_argument(
        "--prompts", default="everyday", help="a built-in set (everyday, stories, code, summarise, grounded) or a file"
    )
    b.add_argument("--gammas", default="1,2,3,4,6,8", help="numbers and/or auto, e.g. 1,2,3,auto")
    b.add_argument("--drafters", default="model", help=f"comma-separated: {', '.join(DRAFTERS)}")
    b.add_argument("--policies", default="constant", help="for numeric gammas: constant, heuristic, confidence")
    b.add_argument(
        "--trees",
        default="off",
        help="token trees for the model drafters: off and/or node budgets and auto, e.g. off,4,8,auto",
    )
    b.add_argument(
        "--configs",
        help="instead of the grid: drafter:gamma[:policy][:tree=N] items, e.g. model:1,model:auto,lookup:auto,"
        "model:auto:tree=auto",
    )
    b.add_argument(
        "--temperatures",
        default="0",
        help="comma-separated, e.g. 0,0.3,0.7,1,1.3: a row per temperature and configuration (the Race tab's "
        "temperature sweep on a prompt set)",
    )
    b.add_argument("--max-new-tokens", type=int, help=f"(default {RunRequest.default('max_new_tokens')})")
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--limit", type=int, default=0, help="use only the first N prompts")
    b.add_argument("--no-hf", action="store_true", help="skip transformers' peers (assisted generation, prompt lookup)")
    b.add_argument("--csv")
    b.add_argument("--json-out", help="write the table and machine facts as JSON")
    b.add_argument(
        "--results", metavar="DIR", help="also write a result file (command, commit, date, CPU, rows) into DIR"
    )
    b.add_argument("--plots", help="folder for plotly charts (HTML, and PNG where kaleido works)")
    b.add_argument("--seed", type=int, help=f"the first prompt's seed (default {RunRequest.default('seed')})")
    b.add_argument("--tokenizer", help="a served --target's tokenizer: hub id or folder (default: the server's model)")
    return ap


def _request(a):
    """The run the arguments ask for: the options given, RunRequest's defaults for the rest."""
    from specviz.request import NAMES, RunRequest

    return RunRequest(**{k: v for k, v in vars(a).items() if k in NAMES and v is not None})


def _generate(a) -> dict:
    from specviz.api import result
    from specviz.backends.served.connect import is_url

    req = _request(a)
    recorded, lanes = {}, {}
    if a.record or is_url(a.target):  # one recorded run (both modes raced for --compare), read back below
        from specviz.recording.record import run_request

        rec = run_request(a.prompt, ("ar", "spec") if a.compare else (req.mode,), req)
        if a.record:
            rec.save(a.record)
        recorded, lanes = {m: rec.result(m) for m in rec.lanes}, rec.lanes
    if not a.compare:
        r = recorded.get(req.mode) or result(a.prompt, req)
        if not a.json:
            print(r.text)
            s = r.stats
            line = f"\n[{s['new_tokens']} tokens, {s['tokens_per_s']:.1f} tok/s, {s['target_calls']} target calls"
            if req.mode == "spec":
                line += f", acceptance {s['acceptance_rate']:.2f}, {s['tokens_per_target_call']:.2f} tokens/call"
            print(line + "]", file=sys.stderr)
            _print_served(a, [r], lanes)
        return {"text": r.text, "token_ids": list(r.token_ids), "stats": r.stats, **_engine_panel(a)}
    ar = recorded.get("ar") or result(a.prompt, req.replace(mode="ar"))
    sp = recorded.get("spec") or result(a.prompt, req.replace(mode="spec"))
    speedup = ar.stats["wall_s"] / sp.stats["wall_s"] if sp.stats["wall_s"] else 0.0
    if not a.json:
        print("── plain decoding ──\n" + ar.text)
        print("── speculative decoding ──\n" + sp.text)
        print(
            f"\nplain {ar.stats['tokens_per_s']:.1f} tok/s · speculative {sp.stats['tokens_per_s']:.1f} tok/s · "
            f"speedup {speedup:.2f}x · acceptance {sp.stats['acceptance_rate']:.2f} · "
            f"identical output: {'yes' if ar.token_ids == sp.token_ids else 'no (sampling)'}"
        )
        _print_served(a, [ar, sp], lanes)
    return {
        **_engine_panel(a),
        "ar": {"text": ar.text, "stats": ar.stats},
        "spec": {"text": sp.text, "stats": sp.stats},
        "speedup": speedup,
    }


def _print_served(a, results, lanes: dict) -> None:
    """For a served target: how it verified, the requests and their share of each run, and the engine's panel."""
    from specviz.backends.served.connect import is_url
    from specviz.events import Round
    from specviz.theory import position_alphas

    if not is_url(a.target):
        return
    for r in results:
        s = r.stats
        share = s["request_s"] / s["wall_s"] if s["wall_s"] else 0.0
        print(
            f"[{s['mode']} through {s['served']}: verify {s['verify']}, {s['requests']} requests, "
            f"{s['request_s']:.2f} s in requests = {share:.0%} of the run]",
            file=sys.stderr,
        )
    panel = _engine_panel(a).get("engine_spec")
    if panel is None:
        print(
            "[the server runs no speculative decoding of its own: /metrics has no vllm:spec_decode counters]",
            file=sys.stderr,
        )
    else:
        per_pos = " ".join(f"{x:.2f}" for x in panel["acceptance_per_pos"])
        print(
            f"[the engine's own speculative decoding since it started: {panel['drafts']} drafts, acceptance per "
            f"position {per_pos}, mean accepted length {panel['mean_accepted_length']:.2f}]",
            file=sys.stderr,
        )
    rounds = [(len(ev.drafted), ev.n) for ev in lanes.get("spec", ()) if isinstance(ev, Round) and ev.drafted]
    if rounds:
        alphas = " ".join(f"{x:.2f}" for x in position_alphas(rounds))
        mean = 1 + sum(n for _, n in rounds) / len(rounds)
        print(f"[specviz's draft here: alpha_k by position {alphas}, mean accepted length {mean:.2f}]", file=sys.stderr)


def _engine_panel(a) -> dict:
    """{"engine_spec": the engine's own speculative decoding (served.EngineSpec) as a dict or None}; {} if local."""
    from specviz.backends.served.connect import connect, engine_spec, is_url

    if not is_url(a.target):
        return {}
    spec = engine_spec(connect(a.target, a.tokenizer, device=a.device))
    if spec is None:
        return {"engine_spec": None}
    return {
        "engine_spec": {
            "drafts": spec.drafts,
            "draft_tokens": spec.draft_tokens,
            "accepted": spec.accepted,
            "acceptance_per_pos": list(spec.acceptance_per_pos),
            "mean_accepted_length": spec.mean_accepted_length,
        }
    }


def _replay(a) -> dict:
    from specviz.recording.export import write_html
    from specviz.recording.record import load

    rec = load(a.recording)
    if a.html:
        write_html(rec, a.html)
    lanes = {name: rec.result(name) for name in rec.lanes}
    if not a.json:
        print(f"A {rec.kind} recorded on {rec.recorded_on} on {rec.env.get('recorded_at', 'an unknown date')}.")
        for name, r in lanes.items():
            s = r.stats
            print(f"── {name} ──\n{r.text}")
            print(
                f"[{s.get('new_tokens')} tokens, {s.get('tokens_per_s', 0):.1f} tok/s, {s.get('target_calls')} target calls]"
            )
        if a.html:
            print(f"wrote {a.html}", file=sys.stderr)
    return {
        "kind": rec.kind,
        "env": rec.env,
        "settings": rec.settings,
        "lanes": {name: {"text": r.text, "stats": r.stats} for name, r in lanes.items()},
        "html": a.html,
    }


def main(argv: list[str] | None = None) -> int:
    from specviz.config import SpecvizError

    a = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for noisy in ("transformers", "httpx", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars would bury the one line a user asked for
    try:
        if a.command == "setup":
            from specviz.models.loaded import load_pair, pair_backend, pair_dtypes
            from specviz.native.library import why_not

            p, q = load_pair(device="cpu")
            print(f"Built-in pair ready: {p.name} ({p.n_params / 1e6:.0f}M) + {q.name} ({q.n_params / 1e6:.1f}M)")
            print(f"On this CPU: {pair_dtypes(p, q)}, {pair_backend(p, q)}")
            if why_not():
                print(f"note: specviz's few-token kernel is not used here: {why_not()}.")
            return 0
        if a.command == "generate":
            out = _generate(a)
        elif a.command == "replay":
            out = _replay(a)
        elif a.command == "check":
            from specviz.pairs.check import check_pair

            rep = check_pair(
                a.target,
                a.draft,
                device=a.device,
                dtype=a.dtype,
                max_new_tokens=a.max_new_tokens,
                drafter=a.drafter,
                quantize=a.quantize,
                tokenizer=a.tokenizer,
            )
            out = rep.to_dict()
            if not a.json:
                print(rep.report())
        elif a.command == "export-draft":
            from specviz.config import BUILTIN_DRAFT
            from specviz.models.export import EXPORT_NOTE, export_draft

            path = export_draft(a.folder, a.draft or BUILTIN_DRAFT, a.target)
            out = {"folder": str(path), **json.loads((path / EXPORT_NOTE).read_text())}
            if not a.json:
                print(
                    f"wrote {path}: {out['draft']} with {out['target_vocab_size']:,} output rows "
                    f"({out['kept_rows']:,} its own, {out['filled_rows']:,} filled so that argmax never picks them)"
                )
        else:
            from specviz.bench.cli import main as bench_main

            out = bench_main(a)
        if a.json:
            print(json.dumps(out, indent=2, default=str))
        return 0
    except SpecvizError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
