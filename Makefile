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

unit: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck unit

golden: $(STAMP)
	$(BIN)/pytest -q tests --overwrite-golden

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
