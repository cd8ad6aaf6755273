# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit golden clean

$(STAMP): pyproject.toml requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

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
unit: $(STAMP)
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=15

test: lint typecheck unit

golden: $(STAMP)
	$(BIN)/pytest -q tests --overwrite-golden

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
