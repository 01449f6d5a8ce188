# Two commands for users: `make demo` and `make test`. Both create .venv when absent.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH_CPU ?= torch==2.13.0
GPU_TESTS ?= tests/kernel_tests tests/gpu

.PHONY: demo test test-fast setup lint typecheck schema figures clean gpu-test deps

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# Without a CUDA driver, install the CPU build of torch first, so the
	# unpinned dependency does not pull a multi-GB CUDA build.
	if ! command -v nvidia-smi >/dev/null 2>&1 && ! $(BIN)/python -c "import torch" 2>/dev/null; then \
		$(BIN)/python -m pip install -q "$(TORCH_CPU)"; fi
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/moec validate --portable examples/*.toml
	$(BIN)/moec explain examples/tiny-cpu.toml --tokens 1,64
	$(BIN)/moec run examples/tiny-cpu.toml --tokens 16
	TRITON_INTERPRET=1 $(BIN)/moec run examples/tiny-cpu-triton.toml --tokens 8
	$(BIN)/moec build examples/tiny-cpu.toml -o out
	cd out && ../$(BIN)/python -m tiny_cpu.check --tokens 1,16

test: $(STAMP)
	$(BIN)/python -m pytest -q -x --durations=15

# The spec, plan and build tier alone, under a minute: for a change above the kernels (make
# test, the whole suite, stays the check).
FAST_TESTS := tests/test_spec_*.py tests/test_plan_*.py tests/test_vocab.py tests/test_schema.py \
	tests/test_user_errors.py tests/test_explain.py tests/test_support_matrix.py tests/test_build.py
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -x -m "not slow" $(FAST_TESTS)

# On a CUDA machine, with moec's dependencies importable by $(PY) (the GPU image's python3 plus
# carried wheels, see README "On the GPU"): the kernel suite compiled, and the GPU layer tests.
# Compiling its ~200 kernels takes about 4 minutes on one core, so with pytest-xdist importable
# the kernel tests are spread over GPU_WORKERS processes, test by test (GPU_DIST=load: 286 tests
# in 174 s on the H200 with 16 workers; loadfile, each file whole in one worker, ran past 370 s,
# as test_route.py's four largest cases take 86 s each in one process). The tests under tests/gpu
# hold whole DeepSeek-V3 layers: they run after, in one process, so that no two of them share the
# GPU's memory (eight at once ran out of it). GPU_ARGS: more pytest arguments for both parts (e.g. -k "not shipped_tuned").
GPU_WORKERS ?= 8
GPU_DIST ?= load
GPU_ARGS ?=
GPU_ENV := NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
	MOEC_KERNEL_DEVICE=cuda TRITON_INTERPRET=0
GPU_LAYER_TESTS := $(filter tests/gpu%,$(GPU_TESTS))
GPU_KERNEL_TESTS := $(filter-out tests/gpu%,$(GPU_TESTS))
gpu-test:
	@status=0; \
	if [ -n "$(GPU_KERNEL_TESTS)" ]; then \
	  $(GPU_ENV) $(PY) -m pytest -q -p no:cacheprovider \
	    $$($(PY) -c 'import xdist; print("-n $(GPU_WORKERS) --dist $(GPU_DIST)")' 2>/dev/null) \
	    $(GPU_ARGS) $(GPU_KERNEL_TESTS); \
	  code=$$?; [ $$code -eq 0 ] || [ $$code -eq 5 ] || status=1; fi; \
	if [ -n "$(GPU_LAYER_TESTS)" ]; then \
	  $(GPU_ENV) $(PY) -m pytest -q -p no:cacheprovider $(GPU_ARGS) $(GPU_LAYER_TESTS); \
	  code=$$?; [ $$code -eq 0 ] || [ $$code -eq 5 ] || status=1; fi; \
	exit $$status

# On a CUDA host: DeepGEMM and DeepEP V1 built from source into DEPS_PREFIX and checked
# (scripts/build_deps.sh --help; DEPS_ARGS e.g. "--deep-gemm-src ../DeepGEMM deep_gemm"), then
# `. $(DEPS_PREFIX)/env.sh` puts them on PYTHONPATH.
DEPS_PREFIX ?= .deps/build
DEPS_ARGS ?=
deps:
	PYTHON=$(PY) scripts/build_deps.sh --prefix $(DEPS_PREFIX) $(DEPS_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check moec tests benchmarks
	$(BIN)/ruff format --check moec tests benchmarks
	# moec/runtime/ is copied into generated packages: ruff's own default rules, as a user runs them
	$(BIN)/ruff check --isolated moec/runtime
	$(MAKE) --no-print-directory typecheck

# mypy over moec/ ([tool.mypy] in pyproject.toml): zero errors, kept there by make lint
typecheck: $(STAMP)
	$(BIN)/python -m mypy

schema: $(STAMP)
	$(BIN)/moec schema

# The figures of the README and benchmarks/RESULTS.md: the plan picture by moec explain (laid out
# by moec where Graphviz is absent, as on CI), the benchmark runs' by benchmarks/plot.py (installs
# the plot extra, matplotlib, when it is missing). tests/test_readme_commands.py checks that the
# first recipe line draws the committed picture.
PLAN_FIGURE ?= docs/figures/plan-deepseek-v3-fp8.svg
RUN12 := benchmarks/runs/2026-12-01-run12-bench
figures: $(STAMP)
	$(BIN)/moec explain examples/deepseek-v3-fp8.toml --tokens 64 --format svg -o $(PLAN_FIGURE)
	$(BIN)/python -c "import matplotlib" 2>/dev/null || $(BIN)/python -m pip install -q -e ".[plot]"
	$(BIN)/python benchmarks/plot.py $(RUN12)_fp8_block.json $(RUN12)_fp8_block_deep_gemm.json \
		$(RUN12)_fp8_block_auto.json -o benchmarks/figures/fp8_block.svg
	$(BIN)/python benchmarks/plot.py $(RUN12)_bf16.json $(RUN12)_bf16_deep_gemm.json \
		-o benchmarks/figures/bf16.svg

clean:
	rm -rf $(VENV) build dist out .pytest_cache
