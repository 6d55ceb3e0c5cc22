# The two commands a newcomer runs: `make demo` and `make test`. Both set everything up on a fresh machine.
.PHONY: setup models demo test test-fast package-check lint bench-engine bench-langchain

VENV := .venv/bin

setup:
	@bash scripts/setup_env.sh

models: setup
	@$(VENV)/relaygen models fetch demo

# A GSM8K question answered by the large model alone and by the pair's default (the small model drafting), compared.
demo: models
	@$(VENV)/relaygen demo

# Everything, including the tests on the real demo pair (fetched here first: no silent skips), the package as a user
# installs it (a wheel outside the checkout, and the dependency floors), then the relay over real vLLM and llama.cpp
# servers in a phase of its own. Their virtualenvs (built on first use: ~11 min on a 2-core AVX2 EPYC, most of it
# compiling llama.cpp) are built in the background at the lowest CPU priority while the main suite runs
# (scripts/serving_setup_background.sh), and stopped if the suite fails.
test: models
	@bash scripts/serving_setup_background.sh start
	@{ $(VENV)/python -m pytest -q -m "not serving_engine" && bash scripts/package_check.sh; } \
		|| { bash scripts/serving_setup_background.sh stop; exit 1; }
	@bash scripts/serving_setup_background.sh wait
	@$(VENV)/python -m pytest -q -m serving_engine

# Quick iteration: tiny random-weight models and scripted models only.
test-fast: setup
	@$(VENV)/python -m pytest -q -m "not real_pair and not serving_engine"

# The wheel in a fresh virtualenv away from the checkout, and the package at its declared dependency floors.
package-check: setup
	@bash scripts/package_check.sh

lint: setup
	@$(VENV)/ruff check . && $(VENV)/ruff format --check .

bench-engine: models
	@$(VENV)/python benchmarks/engine_overhead.py

bench-langchain: models
	@$(VENV)/python benchmarks/langchain_overhead.py
