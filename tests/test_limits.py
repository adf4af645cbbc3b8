"""Deployment limits: env parsing, the model allowlist, folder confinement (no ../, no symlink escape), caps, time."""

import math
import os
import subprocess
import sys
import time

import pytest

from specviz.config import BUILTIN_DRAFT, BUILTIN_TARGET, GAMMA_MAX, SpecvizError
from specviz.limits import Limits

ENV = [
    "SPECVIZ_MAX_NEW_TOKENS",
    "SPECVIZ_MAX_PROMPT_TOKENS",
    "SPECVIZ_MAX_GAMMA",
    "SPECVIZ_MAX_SWEEP",
    "SPECVIZ_REQUEST_TIMEOUT_S",
    "SPECVIZ_CONCURRENCY",
    "SPECVIZ_MAX_QUEUE",
    "SPECVIZ_MAX_LOADED_MODELS",
    "SPECVIZ_ALLOWED_MODELS",
    "SPECVIZ_MODEL_DIRS",
    "SPECVIZ_SESSION_IDLE_S",
    "SPECVIZ_MAX_SESSIONS",
    "SPECVIZ_SESSION_MEMORY_MB",
    "SPECVIZ_TARGET_URLS",
]


@pytest.fixture
def clean_env(monkeypatch):
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


# --- from_env ------------------------------------------------------------------------------------


def test_from_env_defaults(clean_env):
    lim = Limits.from_env()
    assert lim == Limits()
    assert (lim.max_new_tokens, lim.max_prompt_tokens, lim.max_gamma, lim.max_sweep) == (256, 1024, GAMMA_MAX, 8)
    assert lim.allowed_models is None and lim.model_dirs is None  # any hub id, no local folders


def test_from_env_reads_every_variable(clean_env):
    values = dict(zip(ENV[:8], ["32", "100", "6", "3", "20", "2", "10", "2"]))
    for k, v in values.items():
        clean_env.setenv(k, v)
    clean_env.setenv("SPECVIZ_ALLOWED_MODELS", " a/b , c/d,, ")
    clean_env.setenv("SPECVIZ_MODEL_DIRS", "/srv/m1,/srv/m2")
    for k, v in zip(ENV[10:], ["60", "12", "256"]):
        clean_env.setenv(k, v)
    clean_env.setenv("SPECVIZ_TARGET_URLS", "http://10.0.0.5:8000/v1, http://gpu:8000")
    lim = Limits.from_env()
    assert lim == Limits(
        32,
        100,
        6,
        3,
        20,
        2,
        10,
        2,
        ("a/b", "c/d"),
        ("/srv/m1", "/srv/m2"),
        60,
        12,
        256,
        ("http://10.0.0.5:8000/v1", "http://gpu:8000"),
    )
    assert lim.check_model("http://gpu:8000/v1/") == "http://gpu:8000/v1"


def test_gamma_cap_never_exceeds_the_engine_maximum(clean_env):
    clean_env.setenv("SPECVIZ_MAX_GAMMA", "1000")
    assert Limits.from_env().max_gamma == GAMMA_MAX


@pytest.mark.parametrize("value", ["25O", "1.5", "ten", "0", "-3"])
def test_a_typo_in_a_limit_stops_the_app_with_the_variable_named(clean_env, value):
    clean_env.setenv("SPECVIZ_MAX_NEW_TOKENS", value)
    with pytest.raises(SpecvizError, match="SPECVIZ_MAX_NEW_TOKENS"):
        Limits.from_env()


def test_every_variable_is_documented_in_the_deploying_page():
    page = open(os.path.join(os.path.dirname(__file__), "..", "docs", "deploying.md")).read()
    section = page.split("## Every setting", 1)
    assert len(section) == 2, "docs/deploying.md lacks its section of settings"
    for k in ENV:
        assert k in section[1], k


# --- the model allowlist -------------------------------------------------------------------------


def test_builtin_pair_is_always_allowed():
    lim = Limits(allowed_models=("builtin",))
    assert lim.check_model("") == ""
    assert lim.check_model(None) == ""
    assert lim.check_model(BUILTIN_TARGET) == BUILTIN_TARGET
    assert lim.check_model(f"  {BUILTIN_DRAFT} ") == BUILTIN_DRAFT


def test_allowlist_restricts_hub_ids():
    lim = Limits(allowed_models=("HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2"))
    assert lim.check_model("gpt2") == "gpt2"
    assert lim.check_model(" HuggingFaceTB/SmolLM2-135M-Instruct ") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(SpecvizError, match="only allows these models: HuggingFaceTB/SmolLM2-135M-Instruct, gpt2"):
        lim.check_model("meta-llama/Llama-3.1-405B")
    with pytest.raises(SpecvizError, match="built-in pair only"):
        Limits(allowed_models=("builtin",)).check_model("gpt2")


def test_without_allowlist_any_well_formed_hub_id_passes():
    assert Limits().check_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize(
    "name", ["a b", "<script>alert(1)</script>", "x\x00y", "x\ny", "\ud800", "\x1b[31m", "a" * 400, "a--b", "foo::bar"]
)
def test_malformed_names_are_refused_with_one_sentence(name):
    with pytest.raises(SpecvizError) as e:
        Limits().check_model(name)
    assert str(e.value).endswith(".") and "\n" not in str(e.value)


@pytest.mark.parametrize("name", [1, 2.5, ["a"], {"a": 1}, b"gpt2"])
def test_non_text_names_are_refused(name):
    with pytest.raises(SpecvizError, match="must be text"):
        Limits().check_model(name)


# --- folders -------------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path):
    """root/ok (a model folder), root/escape -> outside/, root/inner -> root/ok, outside/secret, root-evil/x."""
    root, outside, evil = tmp_path / "root", tmp_path / "outside", tmp_path / "root-evil"
    (root / "ok").mkdir(parents=True)
    (root / "ok" / "config.json").write_text("{}")
    outside.mkdir()
    (outside / "secret").mkdir()
    (evil / "x").mkdir(parents=True)
    (root / "escape").symlink_to(outside)
    (root / "inner").symlink_to(root / "ok")
    (root / "loop").symlink_to(root / "loop")
    return root, outside, evil


def test_folders_are_refused_when_no_model_dirs_are_configured(tree):
    root, _, _ = tree
    with pytest.raises(SpecvizError, match="does not allow loading local folders"):
        Limits().check_model(str(root / "ok"))


def test_a_folder_inside_model_dirs_loads_by_its_real_path(tree):
    root, _, _ = tree
    lim = Limits(model_dirs=(str(root),))
    assert lim.check_model(str(root / "ok")) == str((root / "ok").resolve())
    assert lim.check_model(str(root / "inner")) == str((root / "ok").resolve())  # a symlink within: resolved


@pytest.mark.parametrize(
    "rel",
    [
        "escape",  # a symlink inside the root pointing outside
        "escape/secret",
        "ok/../../outside/secret",
        "../outside/secret",
        "../root-evil/x",  # a sibling whose name merely starts with the root's name
        ".",  # the root itself
        "loop",  # a symlink loop
    ],
)
def test_paths_cannot_escape_the_model_dirs(tree, rel):
    root, _, _ = tree
    with pytest.raises(SpecvizError, match="outside the folders"):
        Limits(model_dirs=(str(root),)).check_model(f"{root}/{rel}")


@pytest.mark.parametrize("name", ["/etc", "/etc/passwd", "../../etc", "../../../../../../etc/passwd", "~", "~/.ssh"])
def test_system_paths_are_refused(tree, name):
    root, _, _ = tree
    with pytest.raises(SpecvizError, match="outside the folders"):
        Limits(model_dirs=(str(root),)).check_model(name)


def test_a_hub_shaped_name_that_exists_here_is_checked_as_a_folder(tree, monkeypatch):
    """transformers loads an existing folder before it asks the hub: "owner/name" in the cwd is a path."""
    root, outside, _ = tree
    monkeypatch.chdir(outside.parent)
    (outside / "model").mkdir()
    with pytest.raises(SpecvizError, match="does not allow loading local folders"):
        Limits().check_model("outside/model")
    with pytest.raises(SpecvizError, match="outside the folders"):
        Limits(model_dirs=(str(root),)).check_model("outside/model")
    monkeypatch.chdir(root)
    assert Limits(model_dirs=(str(root),)).check_model("ok") == str((root / "ok").resolve())


def test_a_missing_folder_inside_the_root_says_so(tree):
    root, _, _ = tree
    with pytest.raises(SpecvizError, match="no model folder"):
        Limits(model_dirs=(str(root),)).check_model(f"{root}/nope")


# --- one request ---------------------------------------------------------------------------------


def test_check_run_caps_tokens_and_gamma():
    lim = Limits(max_new_tokens=32, max_gamma=6)
    assert lim.check_run(32, 6) == (32, 6)
    assert lim.check_run(8.0, "3") == (8, 3)  # what a JSON client or a slider may send
    with pytest.raises(SpecvizError, match="capped at 32"):
        lim.check_run(33, 4)
    with pytest.raises(SpecvizError, match="from 1 to 6"):
        lim.check_run(8, 7)
    with pytest.raises(SpecvizError, match="from 1 to 6"):
        lim.check_run(8, 0)
    with pytest.raises(SpecvizError, match="at least 1"):
        lim.check_run(0, 4)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e300, 2.5, "x", None, True, [4], {}])
def test_check_run_refuses_non_numbers(bad):
    lim = Limits()
    with pytest.raises(SpecvizError):
        lim.check_run(bad, 4)
    with pytest.raises(SpecvizError):
        lim.check_run(16, bad)


def test_check_sweep():
    lim = Limits(max_sweep=3, max_gamma=8)
    assert lim.check_sweep([4, 1, 4, 2.0]) == (1, 2, 4)
    assert lim.check_sweep("1, 2 8") == (1, 2, 8)
    with pytest.raises(SpecvizError, match="at most 3 gamma values"):
        lim.check_sweep([1, 2, 3, 4])
    with pytest.raises(SpecvizError, match="from 1 to 8"):
        lim.check_sweep([1, 9])
    with pytest.raises(SpecvizError, match="at least one"):
        lim.check_sweep("")
    with pytest.raises(SpecvizError):
        lim.check_sweep([math.nan])
    with pytest.raises(SpecvizError, match="list of gamma values"):
        lim.check_sweep(5)


def test_check_prompt_tokens():
    Limits(max_prompt_tokens=10).check_prompt_tokens(10)
    with pytest.raises(SpecvizError, match="11 tokens; at most 10"):
        Limits(max_prompt_tokens=10).check_prompt_tokens(11)


def test_within_time_stops_after_the_deadline_and_closes_the_source():
    closed = []

    def source():
        try:
            yield from range(1000)
        finally:
            closed.append(True)

    lim = Limits(request_timeout_s=5)
    assert list(lim.within_time(source())) == list(range(1000))  # well within time: untouched
    got = []
    with pytest.raises(SpecvizError, match="5-second limit"):
        for x in lim.within_time(source(), start=time.monotonic() - 6):
            got.append(x)
    assert got == [0] and closed == [True, True]  # one item, then stopped; the engine's generator is closed


def _cache_capacity(value: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECVIZ_MAX_LOADED_MODELS": value}
    code = "from specviz.models.loaded import CACHE; print(CACHE.capacity)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_max_loaded_models_reaches_the_model_cache():
    """SPECVIZ_MAX_LOADED_MODELS sizes the process-wide LRU cache of loaded models."""
    out = _cache_capacity("2")
    assert out.stdout.strip() == "2", out.stderr[-500:]


def test_a_bad_max_loaded_models_is_refused_with_the_variable_named():
    out = _cache_capacity("abc")
    assert out.returncode != 0 and "SpecvizError: SPECVIZ_MAX_LOADED_MODELS must be" in out.stderr, out.stderr[-300:]
