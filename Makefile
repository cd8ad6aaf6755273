# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UV_VERSION := 0.13.9

.PHONY: demo test lint typecheck unit golden clean browser docs screenshots native bytecode

# Python writes each module's bytecode the first time a recipe's process imports it, also where the machine sets
# PYTHONDONTWRITEBYTECODE (this project's machines do): otherwise every process, test subprocesses included, would
# compile torch and transformers from source again (~4 s each). Compiling all of site-packages up front instead
# took 37 s of the set-up (63 s of CPU), most of it for modules no test imports.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# uv installs the same pinned set as pip, from the same indexes (.ci/uv_args.py reads pip's configuration), in
	@# about 2 s where pip takes 3 minutes; pip itself where uv cannot be had or fails.
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION) && \
	  $(BIN)/python -m uv pip install --quiet --python $(BIN)/python \
	    $$($(BIN)/python .ci/uv_args.py) -r requirements-dev.txt || \
	  $(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

# Every installed module's bytecode, as a user's `pip install` leaves it: run before timing a benchmark with
# `.venv/bin/python` outside make on a machine that sets PYTHONDONTWRITEBYTECODE, where each process would
# otherwise compile what it imports from source (a sweep type's model module, torch's lazy imports). Torch ships
# test helpers in later Pythons' syntax (torch/testing/_internal/py312_intrinsics.py), which no 3.11 import reaches.
BYTECODE := $(VENV)/.bytecode
$(BYTECODE): $(STAMP)
	$(BIN)/python -m compileall -q -j 0 -x 'py31[2-9]_' $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") dtypecheck
	touch $(BYTECODE)

bytecode: $(BYTECODE)

# nan-trace's C++ checks (watch mode's, and the full trace's per-output check), built once into the user's cache
# (~25 s; a note, and the Python path, without g++). The tests run both paths, so `unit` needs it; `make test` builds
# it beside ruff, mypy and the docs build. The stamp keeps a later `make unit` from asking again (6 s) until the
# set-up or the C++ source changes.
NATIVE := $(VENV)/.native
$(NATIVE): $(STAMP) $(wildcard dtypecheck/nantrace/native/*.cpp dtypecheck/nantrace/native/*.h)
	$(BIN)/python -m dtypecheck.nantrace.native
	touch $(NATIVE)

native: $(NATIVE)

demo: $(STAMP)
	$(BIN)/python examples/make_example_checkpoint.py --quiet examples/tiny_model.safetensors
	$(BIN)/dtypecheck info fp16 bf16 e4m3 e5m2
	@$(BIN)/dtypecheck scan-model examples/tiny_model.safetensors --target fp16,bf16,e4m3; \
	  echo "scan-model exit code $$? (1 = findings: this example is built to have some)"

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Parallel workers (pytest-xdist), one per core ("auto"; a 2-core CI machine gets 2). loadgroup keeps the tests of
# an expensive shared fixture on one worker (tests/_xdist_groups.py). PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= auto
# The HTML reports are opened in headless Chromium (Debian's package) by tests/render/test_html_browser.py. Installed
# here when missing and this runs as root with apt-get (CI, a fresh machine); elsewhere that one test is skipped,
# saying why. Idempotent: an installed chromium is found at once.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium (apt-get) for the HTML report browser test"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null \
	      || echo "note: chromium could not be installed; the browser test will be skipped"; \
	  else echo "note: chromium is not installed (needs root and apt-get); the browser test will be skipped"; fi

unit: $(STAMP) browser native
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=15

# The docs site (mkdocs-material): every page built, every link and anchor checked.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .site

# docs/img/*.png: each HTML report as a browser shows it (tests/render/_browser.py)
screenshots: $(STAMP) browser
	$(BIN)/python docs/screenshots.py

# The four checks run side by side once the set-up is done: mypy and the docs build are one process each, and the
# tests leave a core idle much of the time (subprocess-heavy tests wait; the last group runs alone). Chromium's
# install (unit's) runs beside the set-up, and the C++ build beside the other checks. Each check's output is printed
# whole when it ends; any failure fails `make test`.
test:
	@$(MAKE) --no-print-directory -j4 --output-sync=target lint typecheck unit docs

golden: $(STAMP) native
	$(BIN)/pytest -q tests --overwrite-golden

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info .site
