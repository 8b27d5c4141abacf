"""The documentation: README.md short, the site built by `mkdocs build --strict` (no broken link or
anchor), every generated page current with the code (python -m grpo.docs), a page opened in headless
Chromium, the quickstart's commands run as written (on the tiny model), every other documented command
accepted by its parser and config, no page naming a seed document, and dated figures on the benchmark
pages only, each with its CPU, date and commit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.docs import stale_pages
from tests.conftest import TEST_BF16, headless_chromium, import_or_skip_unless_ci

ROOT = Path(__file__).resolve().parents[1]
NO_MKDOCS = "mkdocs is not installed: the documentation site is not built here (pip install -e '.[docs]')"


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_generated_pages_are_current():
    assert not stale_pages(), f"out of date with the code: {stale_pages()}; run python -m grpo.docs"


def test_readme_is_short_and_its_first_screen_says_what_and_how():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    first = "\n".join(lines[:30])
    assert "Group Relative Policy Optimization" in first and "make train" in first and "pip install" in first


def test_no_page_names_a_seed_document():
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:80]}" for p in _pages()
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\bseeds? ?0{2}\d|\bthe seeds?'s?\b|seed documents?", line, re.IGNORECASE)
             and "former name" not in line and "another name for" not in line]
    assert not found, "pages naming the seed documents (cite the method's public source):\n" + "\n".join(found)


def test_every_named_source_file_exists():
    """A page (generated ones included: their text comes from docstrings and config sections) that
    names a module of the package, `grpo/train/knobs.py` or `train/knobs.py`, names one that exists:
    a module moved in a restructuring fails here until the pages follow it."""
    layers = "|".join(p.name for p in (ROOT / "grpo").iterdir() if p.is_dir() and not p.name.startswith("_"))
    named = re.compile(rf"(?<![\w/.-])(?:grpo/)?((?:{layers})/[\w/]+\.py|grpo/\w+\.py)\b")
    missing = []
    for p in _pages():
        prose = re.sub(r"^```.*?^```", "", p.read_text(), flags=re.MULTILINE | re.DOTALL)
        for m in named.finditer(prose):
            path = m.group(1) if m.group(1).startswith("grpo/") else f"grpo/{m.group(1)}"
            if not (ROOT / path).is_file():
                missing.append(f"{p.relative_to(ROOT)}: {m.group(0)}")
    assert not missing, "pages naming modules that do not exist:\n" + "\n".join(sorted(set(missing)))


_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def test_dated_figures_are_on_the_benchmark_pages_only():
    dated = [f"{p.relative_to(ROOT)}:{i}" for p in _pages() if "benchmarks" not in p.parts
             for i, line in enumerate(p.read_text().splitlines(), 1) if _DATE.search(line)]
    assert not dated, f"dated measurements outside docs/benchmarks/: {dated}"


def test_every_benchmark_figure_names_cpu_date_and_commit():
    """Each section of the benchmarks page (between headings) names a CPU or GPU, a date and a commit,
    and so does each dated section of the tool-format page."""
    text = (ROOT / "docs/benchmarks/index.md").read_text()
    sections = re.split(r"^#{2,3} ", text, flags=re.MULTILINE)[1:]
    assert len(sections) >= 10
    tools = re.split(r"^#{2,3} ", (ROOT / "docs/benchmarks/tool-format.md").read_text(), flags=re.MULTILINE)[1:]
    sections += [sec for sec in tools if _DATE.search(sec)]
    for sec in sections:
        title = sec.splitlines()[0]
        assert re.search(r"EPYC|Xeon|H200", sec), f"{title}: no CPU named"
        assert _DATE.search(sec), f"{title}: no date"
        assert re.search(r"\b[0-9a-f]{7}\b", sec), f"{title}: no commit"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site as `mkdocs build --strict` writes it (a warning, e.g. a broken link, fails the build)."""
    import_or_skip_unless_ci("mkdocs", NO_MKDOCS)
    import_or_skip_unless_ci("material", NO_MKDOCS)
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def test_site_builds_with_every_page(site):
    for page in ("index.html", "getting-started/index.html", "reference/config/index.html",
                 "reference/metrics/index.html", "benchmarks/index.html", "concepts/objective/index.html"):
        assert (site / page).is_file(), page


def test_a_page_opens_in_headless_chromium(site):
    browser = headless_chromium()
    try:
        browser.get((site / "reference" / "config" / "index.html").resolve().as_uri())
        assert browser.find_element("tag name", "h1").text == "Configuration"
        headings = [h.text for h in browser.find_elements("css selector", "article h2")]
        assert "Rewards" in headings and "Hardware and distributed" in headings
        rows = browser.find_elements("css selector", "article table tbody tr")
        assert len(rows) > 100  # every config key
        links = browser.find_elements("css selector", "nav a[href]")
        assert any("getting-started" in (a.get_attribute("href") or "") for a in links)
    finally:
        browser.quit()


def _block(path: Path) -> str:
    text = path.read_text()
    start, end = text.index("<!-- quickstart -->"), text.index("<!-- /quickstart -->")
    block = text[start:end]
    return block[block.index("```bash\n") + 8:block.rindex("```")]


def test_quickstart_runs_as_written(tmp_path, tiny_model_dir):
    """README's quickstart (the getting-started page holds the same block) runs as written in a fresh
    folder; only the model is the tiny one, and the run is cut to one short step: the `grpo` the
    block calls appends those keys to `grpo train` (a later key=value wins)."""
    block = _block(ROOT / "README.md")
    assert block == _block(ROOT / "docs/getting-started.md"), "the two quickstarts differ"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    fast = (f"model={tiny_model_dir} max_steps=1 num_generations=2 prompts_per_step=2 max_completion_length=8 "
            f"eval_prompts=2 eval_pass_k=0 eval_max_new_tokens=8 progress=false report_to=none reward_timeout=0 "
            f"bf16={TEST_BF16}")
    grpo = bin_dir / "grpo"
    grpo.write_text(f'#!/bin/sh\nif [ "$1" = train ]; then exec "{sys.executable}" -m grpo.cli "$@" {fast}; fi\n'
                    f'exec "{sys.executable}" -m grpo.cli "$@"\n')
    grpo.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(["bash", "-e", "-c", block], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the quickstart failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    run = work / "runs" / "products"
    assert (run / "metrics.jsonl").is_file() and (run / "eval.json").is_file()
    assert "rewards/my_reward:last_number" in (run / "metrics.jsonl").read_text()
    assert (run / "report" / "report.html").is_file()
    assert len((work / "products.jsonl").read_text().splitlines()) == 121



def test_cli_page_never_holds_a_key_from_the_environment(monkeypatch):
    """`--api-key` defaults to $GRPO_SERVE_API_KEY: the generated page is the same with it set."""
    from grpo.docs import cli_page

    monkeypatch.setenv("GRPO_SERVE_API_KEY", "key-from-the-environment")
    monkeypatch.setenv("GRPO_CODE_GRADER_KEY", "key-from-the-environment")
    assert "key-from-the-environment" not in cli_page()


_COMMAND = re.compile(r"^(?:torchrun .*?-m grpo\.cli|python -m grpo\.cli|grpo) ((?:control |data |prm )?[a-z-]+)(.*)$")


def _documented_commands() -> list[tuple[str, str, str]]:
    """(page, command, its arguments) for every `grpo ...` line of a shell block of README and docs/."""
    found = []
    for page in _pages():
        for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", page.read_text(), re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                m = _COMMAND.match(line.split(" #")[0].strip())
                if m:
                    found.append((str(page.relative_to(ROOT)), f"grpo {m.group(1)}", m.group(2)))
    return found


def _unplaceheld(value: str, default):
    """A placeholder (PATH, K) stands for a value: text stays, a number or flag takes the default."""
    return value if not re.fullmatch(r"[A-Z_]+", value) or isinstance(default, str | None) else default


def test_every_documented_command_parses_and_names_real_keys():
    """Every `grpo` command line the pages show is accepted by its command's parser, and a `train` or
    `eval` line's key=value pairs make a Config (a value written as a placeholder, e.g. PATH, is
    replaced by the key's default where that is not text): a renamed flag or config key fails here, not in a reader's shell."""
    import contextlib
    import io
    import shlex

    from grpo.config.io import defaults, load_config
    from grpo.docs import command_parsers
    from grpo.errors import GrpoError

    parsers, default = command_parsers(), defaults()
    commands = _documented_commands()
    assert len(commands) >= 30
    bad = []
    for page, name, args in commands:
        argv = shlex.split(args)
        try:
            with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
                parsers[name].parse_args(argv)
        except SystemExit as e:
            if e.code:
                bad.append(f"{page}: {name}{args}: {err.getvalue().strip().splitlines()[-1:]}")
        except KeyError:
            bad.append(f"{page}: {name}: no such command")
        if name in ("grpo train", "grpo eval"):
            pairs = [a.split("=", 1) for a in argv if "=" in a and not a.startswith("-")]
            try:
                load_config(None, [f"{k}={_unplaceheld(v, default.get(k))}" for k, v in pairs])
            except GrpoError as e:
                bad.append(f"{page}: {name}{args}: {e}")
    assert not bad, "documented commands that do not run as written:\n" + "\n".join(bad)
