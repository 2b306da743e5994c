# Two commands do all the set-up on a fresh machine: `make demo` (the main job) and `make test`.
PYTHON ?= python3
# CUDA builds of torch/torchvision also run on CPU; these versions install from this project's machine cache.
TORCH ?= torch==2.14.1 torchvision==0.29.1

.PHONY: install demo test lint

install:
	$(PYTHON) -m pip install -q $(TORCH)
	$(PYTHON) -m pip install -q -e '.[dev]'

demo: install
	$(PYTHON) -m vit_rope.demo

lint:
	$(PYTHON) -m ruff check .

test: install lint
	$(PYTHON) -m pytest -q
