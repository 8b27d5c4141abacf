"""Shared fixtures: a tiny randomly initialised Llama and a byte-level tokenizer with a chat template,
saved to a folder so tests load them through the real ``from_pretrained`` path.

``GRPO_TEST_SEED`` (default 0) is the global seed of the tiny-model tests: the random model's weights
and the training runs' ``seed``. Those tests must pass for any value (``GRPO_TEST_SEED=3 make test``);
a test whose check needs a property of the draw (step 1 has reward signal) searches seeds from it
with ``first_seed`` and fails loudly when none has the property.

``GRPO_TEST_PRECISION`` (fp32, the default, or bf16) is the precision the training tests run in
(their configs' ``bf16``), so the suite never depends on whether the CPU has native bf16: with
``GRPO_TEST_PRECISION=bf16 make test`` they train under bf16 autocast, which works, emulated, on any
CPU. Tests whose check is exact to fp32 rounding (two processes against one, fp32 invariances) pin
``bf16=False`` and say why.

The suite does not depend on the machine's history: it runs with a cache folder of its own
(``GRPO_CACHE``, a fresh folder per session: the native build, the timed kernel and backend choices,
and Inductor's compiled kernels), never the user's ``~/.cache/grpo`` or Inductor's folder in /tmp. After each test, ``_global_state`` puts back what a test may change
for the tests after it (torch / numpy / random generator states, torch's threads and default dtype,
the working folder, the environment, the module search path, glibc's memory policy, the kernel plans
measured in this process); a test that left its threads, dtype, folder or environment changed errors
at teardown, naming what it changed (the module search path, the memory policy and the measured plans
are put back without a word: the trainer changes them on purpose). The timed kernel and backend
choices written to the session's cache folder stay: measuring them again for every test would cost
the suite minutes, and every choice among them computes the same values (tests that compare tokens
pin the products: ``runnable_kernels``).

At the end, the skipped tests are summed up by the feature they lacked (tests/skip_groups.py), and
written to ``GRPO_SKIP_REPORT`` when set (``make test`` merges the main and vLLM suites' reports)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import random
import shutil
import sys
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import settings

from tests.skip_groups import session_report, summary_lines

# no per-example deadline: an example's wall time says how busy the machine is, not whether the code is right
settings.register_profile("grpo", deadline=None)
settings.load_profile("grpo")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|pad|>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|pad|>"]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


TEST_SEED = int(os.environ.get("GRPO_TEST_SEED", "0"))
_PRECISION = os.environ.get("GRPO_TEST_PRECISION", "fp32").lower()
if _PRECISION not in ("fp32", "bf16"):
    raise ValueError(f"GRPO_TEST_PRECISION: {_PRECISION!r} is not valid; choose fp32 or bf16")
TEST_BF16 = _PRECISION == "bf16"

SUITE_CACHE = ""  # the session's own cache folder (pytest_configure)

NO_BWRAP = ("bubblewrap (bwrap) is not on PATH: the code sandbox cannot run here "
            "(apt-get install -y bubblewrap; make test installs it when run as root)")
# the code reward refuses to run without bubblewrap (grpo.rewards.sandbox): its tests skip, as root too
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason=NO_BWRAP)


def need_bwrap() -> None:
    """Skip where bubblewrap is missing (for fixtures; tests take the ``needs_bwrap`` mark)."""
    if shutil.which("bwrap") is None:
        pytest.skip(NO_BWRAP)


def first_seed(has_property, what: str, tries: int = 10) -> int:
    """The first seed from TEST_SEED on for which ``has_property(seed)`` holds; fails the test, naming
    ``what``, when none of ``tries`` seeds does (the check it guards could not be made)."""
    for seed in range(TEST_SEED, TEST_SEED + tries):
        if has_property(seed):
            return seed
    pytest.fail(f"no seed in {TEST_SEED}..{TEST_SEED + tries - 1} has {what}")


NO_CHROMIUM = "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"


def skip_unless_ci(reason: str) -> None:
    """Skip with ``reason``; under CI=true, where `make test` must have installed the toolchain, fail."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: a failure, not a skip)")
    pytest.skip(reason)


def import_or_skip_unless_ci(module: str, reason: str):
    """``module`` imported; where it is missing, ``skip_unless_ci(reason)``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        skip_unless_ci(reason)


def headless_chromium():
    """A selenium driver of Debian's headless Chromium; where it is missing, skip (NO_CHROMIUM), and
    under CI=true fail."""
    webdriver = import_or_skip_unless_ci("selenium.webdriver", "selenium is not installed (pip install -e '.[dev]')")
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        skip_unless_ci(NO_CHROMIUM)
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=opts)


def need_native() -> None:
    """Skip where no C compiler is installed (the native decode ops are optional); where one is, the
    build must succeed."""
    from grpo.rollout import native

    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on PATH: the native decode ops are not built here")
    assert native.unavailable_reason() is None, native.unavailable_reason()


def runnable_kernels(kernels: str) -> str:
    """``kernels`` (a ``decode_kernels`` value naming products, never 'auto'), after skipping where one
    of its products cannot run here. Tests that compare the fast loop's tokens with ``generate``'s pin
    the products this way: which one the timing picks depends on the machine's load."""
    from grpo.rollout import tuning

    fixed = tuning.parse_override(kernels)
    assert set(fixed) == set(tuning.ROLES), f"pin every role, not {kernels!r}"
    for name in sorted(set(fixed.values())):
        reason = tuning.PRODUCTS[name].unavailable()
        if reason is not None:
            pytest.skip(f"decode kernel {name} cannot run here: {reason}")
    return kernels


def build_tiny_reward_model(path):
    """A tiny random LlamaForSequenceClassification (one label) with the byte-level tokenizer, saved at path."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id, bos_token_id=None)
    LlamaForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def build_tiny_model(vocab_size: int, seed: int = 0, eos_id: int | None = None, pad_id: int | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A folder with a tiny random Llama and its tokenizer, loadable by from_pretrained."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tok = build_tokenizer()
    model = build_tiny_model(len(tok), seed=TEST_SEED, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def tiny_dataset(tmp_path):
    """A JSONL task of 24 arithmetic prompts."""
    path = tmp_path / "sums.jsonl"
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(1, 7) for b in range(1, 5)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


# set by pytest and by libraries themselves (torch's inductor whenever it looks up its cache, pygame on
# import): theirs to manage, not a test's leak
_OWNED_ENV = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
              "PYGAME_HIDE_SUPPORT_PROMPT"}


def _state() -> dict:
    """What a test can change for every test after it."""
    try:
        cwd = os.getcwd()
    except OSError:  # the folder was removed
        cwd = None
    from grpo.rollout import tuning

    return {"threads": torch.get_num_threads(), "dtype": torch.get_default_dtype(), "cwd": cwd,
            "env": dict(os.environ), "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
            "random": random.getstate(), "sys_path": list(sys.path), "measured": tuning.MEASURED,
            "plans": dict(tuning.MEASURED), "plan_notes": list(tuning.MEASURED.notes)}


def _put_back(before: dict) -> tuple[list[str], list[str]]:
    """Restore ``before``; return what had changed: (threads, dtype, folder), (environment variables).
    The generators are restored without a word: most tests draw from them."""
    from grpo.infra.runtime import default_memory_policy

    torch.set_rng_state(before["torch_rng"])
    np.random.set_state(before["numpy_rng"])
    random.setstate(before["random"])
    sys.path[:] = before["sys_path"]  # the trainer puts its working_dir first (import_from)
    default_memory_policy()  # the trainer keeps freed memory (keep_freed_memory): the next test starts without
    measured = before["measured"]  # the process's plan cache (a test may have swapped in its own)
    measured.clear()
    measured.update(before["plans"])
    measured.notes[:] = before["plan_notes"]
    changed = []
    if torch.get_num_threads() != before["threads"]:
        changed.append(f"torch threads {before['threads']} -> {torch.get_num_threads()}")
        torch.set_num_threads(before["threads"])
    if torch.get_default_dtype() != before["dtype"]:
        changed.append(f"torch default dtype {before['dtype']} -> {torch.get_default_dtype()}")
        torch.set_default_dtype(before["dtype"])
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    if cwd != before["cwd"] and before["cwd"] is not None:
        changed.append(f"working folder {before['cwd']} -> {cwd}")
        os.chdir(before["cwd"])
    env = []
    if os.environ != before["env"]:
        keys = sorted(k for k in set(os.environ) | set(before["env"])
                      if os.environ.get(k) != before["env"].get(k) and k not in _OWNED_ENV)
        env = [f"{k}={before['env'].get(k)!r} -> {os.environ.get(k)!r}" for k in keys]
        for k in keys:  # only those: a thread still running (a server of a module's fixture) reads the rest
            if k in before["env"]:
                os.environ[k] = before["env"][k]
            else:
                del os.environ[k]
    return changed, env


@pytest.fixture(autouse=True)
def _global_state(request):
    """Each test starts from the state the one before started from (see the module docstring)."""
    before = _state()
    yield
    changed, env = _put_back(before)
    if env:
        changed.append(f"the environment ({'; '.join(env)}: use monkeypatch.setenv)")
    if changed:
        pytest.fail(f"{request.node.nodeid} left global state changed (restored for the next test): "
                    f"{'; '.join(changed)}. Use monkeypatch, or restore it in the test.", pytrace=False)


def pytest_terminal_summary(terminalreporter):
    """The skipped tests by feature group; written to GRPO_SKIP_REPORT for make test's summary."""
    skipped = []
    for rep in terminalreporter.stats.get("skipped", []):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        skipped.append((rep.nodeid, reason.removeprefix("Skipped: ")))
    ran = {rep.nodeid for key in ("passed", "failed") for rep in terminalreporter.stats.get(key, [])
           if getattr(rep, "when", None) == "call"}
    report = session_report(os.environ.get("GRPO_SKIP_SUITE", "pytest"), skipped, sorted(ran))
    if os.environ.get("GRPO_SKIP_REPORT"):
        with open(os.environ["GRPO_SKIP_REPORT"], "w") as f:
            json.dump(report, f)
    if skipped:
        terminalreporter.section("skipped feature groups")
        for line in summary_lines([report])[1:]:
            terminalreporter.line(line.strip())


# what makes a test part of the full suite only (`make test-fast` = pytest --fast leaves it out): it, or
# a fixture it uses, trains a model, starts a process or a server, or loads the embedded model
HEAVY = ("Trainer(", ".train()", "subprocess", "Popen", "main([", "_main([", "serve_forever", "make_server",
         "run_sft", "multiprocessing", "mp.Process", "spawn", "torch.distributed", "DEFAULT_MODEL",
         "GRPOTrainer(", "RewardRunner(", "EngineProcess(", "ProcessPool", "grading_service",
         "loss_and_advantage_functions", "run_seed(", "math_reward")


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true", help="only the pure and unit tests: none that trains a model, "
                     "starts a process or a server, or loads the embedded model (tests/conftest.py HEAVY)")


def _heavy(item) -> bool:
    """Whether the test's function, a fixture it uses (at any depth), or a function of the tests'
    own that one of these calls (three calls deep) mentions one of HEAVY."""
    todo = [(getattr(item, "function", None), 0)]
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        todo += [(d.func, 0) for defs in info.name2fixturedefs.values() for d in defs]
    seen = set()
    while todo:
        f, depth = todo.pop()
        f = inspect.unwrap(f) if callable(f) else f
        if not inspect.isfunction(f) or f in seen:
            continue
        seen.add(f)
        try:
            src = inspect.getsource(f)
        except (OSError, TypeError):
            continue
        if any(h in src for h in HEAVY):
            return True
        if depth < 3:  # the helpers it calls, where they are the tests' own (not grpo's or a library's)
            for name in f.__code__.co_names:
                g = f.__globals__.get(name)
                if inspect.isfunction(g) and g.__module__.startswith("tests"):
                    todo.append((g, depth + 1))
    return False


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--fast"):
        return
    heavy = [item for item in items if _heavy(item)]
    if heavy:
        config.hook.pytest_deselected(items=heavy)
        items[:] = [item for item in items if item not in set(heavy)]


def pytest_configure(config):
    """Set before any test (or a process a test starts, which inherits it) reads it; here, not at
    import: a script a test runs may import this module, and shares the session's folder."""
    global SUITE_CACHE
    SUITE_CACHE = tempfile.mkdtemp(prefix="grpo-test-cache-")
    os.environ["GRPO_CACHE"] = SUITE_CACHE
    # torch.compile's kernels too (torch_compile=true): not those another run compiled into /tmp
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(SUITE_CACHE, "inductor")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # make test's two workers, one core each: torch's own threads
        # would spin against the other worker's (a 7 s test took 63 s); the processes a test starts inherit
        # the setting, so a run in the test's process and one it starts compute with the same threads
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    random.seed(TEST_SEED)  # numpy's and Python's generators start from entropy otherwise; torch's from a constant
    np.random.seed(TEST_SEED)


def pytest_unconfigure(config):
    if SUITE_CACHE:
        shutil.rmtree(SUITE_CACHE, ignore_errors=True)
