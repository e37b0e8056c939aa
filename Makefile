# Two targets a newcomer needs: `make demo` (set up, then run the built-in example) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup demo test bench clean

$(BIN)/onnx-quant: pyproject.toml
	./scripts/setup $(VENV) $(PYTHON)

setup: $(BIN)/onnx-quant

demo: setup
	$(BIN)/onnx-quant infer example
	$(BIN)/onnx-quant demo

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/onnx-quant bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
