# Two commands do all the set-up on a fresh machine: `make demo` (the main job) and `make test`.
# They install into the project's own virtual environment, because a stock Debian/Ubuntu refuses pip into the system
# Python (PEP 668). PYTHON=/path/to/python uses that interpreter as it is instead; VENV_PYTHON picks the one that
# creates the environment.
VENV ?= .venv
VENV_PYTHON ?= python3
PYTHON ?= $(VENV)/bin/python
# CUDA builds of torch/torchvision also run on CPU; these versions install from this project's machine cache.
TORCH ?= torch==2.14.1 torchvision==0.29.1
# The GPU targets (gpu-check, gpu-bench, bench-cuda, study-vit-s) install into .venv only when they run its Python: with
# PYTHON=python3 (an interpreter that already has torch, timm >= 1.0.31 and the rest, e.g. with PYTHONPATH=$$PWD for a
# plain checkout) they install nothing, so they run on a GPU machine without a package index.
GPU_INSTALL = $(if $(filter $(VENV)/bin/python,$(PYTHON)),install)

.PHONY: install demo study study-v2 study-v3 study-v4 study-encodings study-swin study-vit-s naflex-demo data-sources-demo \
	bench-cuda bench-kinds \
	bench-twins bench-swin eval-high-res timm-suite test lint gpu-check gpu-bench

$(VENV)/bin/python:
	$(VENV_PYTHON) -m venv $(VENV) || { echo "Could not create $(VENV): install python3-venv (Debian/Ubuntu:" \
		"apt-get install python3-venv) or name an interpreter with make PYTHON=..." >&2; exit 1; }

install: $(filter $(VENV)/bin/python,$(PYTHON))
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q $(TORCH)
	$(PYTHON) -m pip install -q -e '.[dev]'

DEMO_OUT ?= output/demo
# Trains a 6-block tiny RoPE-Mixed ViT on Imagenette at 64 px, then evaluates it at 0.75x to 2.5x the training size
# under four RoPE resolution policies, on 1,000 val images: 8 min 54 s with .venv already made, when last measured on
# a 2-core Intel Xeon CPU (2026-12-03; README.md).
demo: install
	$(PYTHON) train.py -c configs/imagenette_cpu.yaml --output $(DEMO_OUT)
	$(PYTHON) -m vit_rope.evaluate --checkpoint $(DEMO_OUT)/best.pth --img-sizes 48 64 96 128 160 --limit 1000 --workers 1 \
		--policy extrapolate interpolate ntk yarn --output $(DEMO_OUT)/eval

# The resolution-extrapolation study (docs/studies.md): 5 models x 2 seeds trained at 64 px, evaluated at 48-160 px under every
# policy; about 85 min on a 2-core CPU. Finished runs in output/study are kept, so an interrupted study resumes.
study: install
	$(PYTHON) scripts/imagenette_study.py --study v1

# Study v2 (docs/studies.md): the training arms (coordinate augmentation, train_sizes, patch 8) with their APE baselines,
# 12 arms x 2 seeds; each arm is evaluated and reported as soon as its seeds finish, and a rerun resumes.
study-v2: install
	$(PYTHON) scripts/imagenette_study.py --study v2

# Study v3 (docs/studies.md): APE, RoPE-Axial and RoPE-Mixed on a 14x14 training grid (8 px patches at 112 px), 2 seeds,
# evaluated at 80-256 px; about 16 h on a 2-core CPU. Resumable: a rerun continues each unfinished run from last.pth.
study-v3: install
	$(PYTHON) scripts/imagenette_study.py --study v3

# Study v4 (docs/studies.md): the training-side remedies and the data question on v3's 14x14 grid, 2 seeds each, about
# 2.5 h per run on a 2-core CPU. Resumable, and it skips finished runs and evaluations.
study-v4: install
	$(PYTHON) scripts/imagenette_study.py --study v4

# Position encodings on v2's 8x8 grid (docs/studies.md): golden-angle RoPE, STRING over RoPE-Mixed, LookHere, 2D-ALiBi,
# FIRE, PaPE, PaPE-RI, ComRoPE-AP/LD, LieRE and no encoding at all, 2 seeds each, beside one re-run seed of v2's
# RoPE-Mixed, RoPE-Axial and APE patch-8 arms; 25 runs of 10-46 min of training and 6-21 min of evaluation (every
# policy of the kind) each, about 17 h in all on a busy 2-core CPU. Resumable.
study-encodings: install
	$(PYTHON) scripts/imagenette_study.py --study encodings --seeds 0
	$(PYTHON) scripts/imagenette_study.py --study encodings --arms golden string_mixed lookhere alibi nope fire pape \
		pape_ri comrope_ap comrope_ld liere --seeds 1

# A small Swin (docs/studies.md): timm's relative position bias, RoPE-Axial and RoPE-Mixed, 2 seeds each, 9-12 min
# of training and 2.5-5.5 min of evaluation (windows scaled with the image, then kept as trained) a run on a 2-core
# CPU, about 95 min in all. Resumable.
study-swin: install
	$(PYTHON) scripts/imagenette_study.py --study swin

# The demo's training from the image folder, from WebDataset shards and from a Hugging Face dataset of the same images
# (docs/data.md), 2 seeds each: about 9 min a run, 55 min in all on a 2-core CPU. Resumable.
data-sources-demo: install
	$(PYTHON) scripts/data_sources_demo.py

# NaFlex against the square pipeline (docs/training.md): the demo's model trained both ways at about 2,000 tokens per
# step for the demo's 20 epochs, then both evaluated at square sizes and at token budgets, under both policies that
# keep positions (as trained) or the training grid's range; about 45 min on a 2-core CPU.
NAFLEX_OUT ?= output/naflex_demo
NAFLEX_RESULTS ?= results/imagenette/naflex
naflex-demo: install
	$(PYTHON) train.py -c configs/imagenette_cpu.yaml --output $(NAFLEX_OUT)/square
	$(PYTHON) train.py -c configs/imagenette_naflex.yaml --output $(NAFLEX_OUT)/naflex
	$(PYTHON) -m vit_rope.evaluate --checkpoint $(NAFLEX_OUT)/square/last.pth $(NAFLEX_OUT)/naflex/last.pth \
		--img-sizes 48 64 96 128 160 --seq-lens 9 16 36 64 100 --policy extrapolate interpolate --limit 1500 \
		--workers 1 --output $(NAFLEX_RESULTS)
	for run in square naflex; do mkdir -p $(NAFLEX_RESULTS)/$$run && \
		cp $(NAFLEX_OUT)/$$run/config.yaml $(NAFLEX_OUT)/$$run/metrics.csv $(NAFLEX_RESULTS)/$$run/ || exit 1; done

# On a machine with CUDA GPUs: ViT-S on the 14x14 grid (configs/imagenette_vit_s), APE / Axial / Mixed x 2 seeds, trained
# with torchrun over every GPU, evaluated at 80-256 px; resumable. DATA_DIR=... reads another copy of Imagenette.
study-vit-s: $(GPU_INSTALL)
	$(PYTHON) scripts/imagenette_study.py --study vit_s $(if $(DATA_DIR),--data-dir $(DATA_DIR))

# On a machine with a CUDA GPU: the fused-rotation tests on CUDA, then ViT-S throughput in bf16 (eager and compiled,
# 224 and 384 px) against DeiT-III and timm's ports, the rotation alone against the GPU's copy bandwidth, and the
# Triton kernel's block-size x warps sweep (any setting faster than the default launch is worth a patch).
BENCH_OUT ?= results/performance
bench-cuda: $(GPU_INSTALL)
	$(PYTHON) -m pytest -q -m cuda
	$(PYTHON) benchmarks/throughput.py --device cuda --amp --compile both --img-sizes 224 384 --batch-size 128 \
		--rounds 15 --steps 10 --json $(BENCH_OUT)/throughput_cuda_bf16_vit_s.json
	for kind in axial mixed; do $(PYTHON) benchmarks/rope_kernel.py --device cuda --dtype bfloat16 --kind $$kind \
		--batch-size 128 --json $(BENCH_OUT)/rope_kernel_cuda_bf16_$$kind.json || exit 1; done
	$(PYTHON) benchmarks/tune_rope_kernel.py --device cuda --json $(BENCH_OUT)/tune_rope_kernel_cuda.json
	$(PYTHON) benchmarks/naflex.py --device cuda --json $(BENCH_OUT)/naflex_cuda_vit_s.json

# The GPU claims in two commands of at most 8 minutes each on one H100 (docs/gpu.md): gpu-check runs the CUDA tests,
# every family's bf16 logits against fp32 on the CPU, a compiled train.py run on Imagenette (DATA_DIR: train/ and val/,
# or the folder the 160 px tarball unpacked into) and its evaluation, and the rotation against the copy bandwidth;
# gpu-bench the throughput against DeiT-III-S and timm's ports (eager, compiled), the kernel sweep and data feeding.
# Each step goes on past a failed one; the summary and its JSON land in OUT. DEVICE=cpu runs every step at tiny sizes.
DEVICE ?= cuda
gpu-check gpu-bench: $(GPU_INSTALL)
	$(PYTHON) scripts/gpu_check.py --suite $(@:gpu-%=%) --device $(DEVICE) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) \
		$(if $(OUT),--output $(OUT))

# On a quiet CPU (nothing else running; docs/performance.md): the position-encoding kinds against axial RoPE, ViT-S,
# batch 8 at 224 px and 2 at 448 px (about 15 min on a 2-core CPU), and the twins of timm's Eva backbones against
# timm's models at their native inputs (about 15 min, most of it Sapiens2 at 1024x768).
bench-kinds: install
	$(PYTHON) benchmarks/throughput.py --family kinds --img-sizes 224 448 --batch-sizes 8 2 --rounds 15 --steps 2 \
		--json $(BENCH_OUT)/throughput_cpu_kinds_vit_s.json

bench-twins: install
	$(PYTHON) benchmarks/twins.py --rounds 5 --json $(BENCH_OUT)/twins_cpu.json

# RoPE-Swin-T against timm's Swin-T and the official RoPE-Swin code, batch 8 at 224 px (about 10 min on a 2-core CPU).
bench-swin: install
	$(PYTHON) benchmarks/swin.py --rounds 7 --json $(BENCH_OUT)/swin_cpu.json

# The evaluation harness at high resolution, every kind (ViT-Ti, random weights: cost, not accuracy) at 1024 and
# 2048 px, one image each (docs/evaluation.md, "What a size costs"; about 15 min on a 2-core CPU).
HIGH_RES_KINDS = axial mixed golden string lookhere alibi fire pape pape_ri comrope_ap comrope_ld liere
eval-high-res: install
	$(PYTHON) -m vit_rope.evaluate --model vit_tiny_patch16_224 $(HIGH_RES_KINDS:%=vit_rope_tiny_patch16_%_224) \
		vit_rope_small_patch16_dinov3 --random-init --img-sizes 1024 2048 --limit 1 --batch-size 1 --workers 0 \
		--output $(BENCH_OUT)/high_res_eval

# timm's own model tests (tests/test_models.py of the installed timm's source release, downloaded from PyPI) on the
# vit_rope_* models: forward, backward, default configs, features, FX, TorchScript. Hours on a CPU for all 75 models;
# MODELS narrows them with a pytest -k expression (make timm-suite MODELS=tiny: about 2 min on a 2-core CPU).
timm-suite: install
	$(PYTHON) scripts/timm_model_suite.py $(if $(MODELS),--match "$(MODELS)")

lint:
	$(PYTHON) -m ruff check .

# The suite in TEST_WORKERS pytest processes (pytest-xdist; each test file whole in one of them, torch on one thread
# each: tests/conftest.py); TEST_WORKERS=0 runs it in this process alone.
TEST_WORKERS ?= 2
test: install lint
	$(PYTHON) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
