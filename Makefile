PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-models fuzz clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

demo: $(VENV)/.installed
	mkdir -p build
	$(BIN)/kpu-kernel-compiler examples/matmul_256.dfg -o build/matmul_256.kpu
	$(BIN)/kpu-loader build/matmul_256.kpu --config configs/standard.json --check --profile

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest

# The real models at full size (tests marked `models`: the onnx package's light models), a few minutes.
test-models: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m models

# The property and fuzz tests with fresh random draws, twenty times as many (about a quarter of an hour).
fuzz: $(VENV)/.installed-test
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest tests/test_fuzz_dfg.py tests/test_fuzz_hlo.py tests/test_fuzz_onnx.py \
		tests/test_fuzz_inputs.py \
		tests/test_bind.py tests/test_matmul_property.py tests/test_inputs_hardening.py \
		tests/test_output_files.py

clean:
	rm -rf build $(VENV)
