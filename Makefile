# trainmaster: `make run` starts the whole stack, `make test` runs every test tier. Both install what they need.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run check test test-fast test-gpu browser bench bench-submit bench-eta bench-sched bench-reports bench-search bench-scale eta-prior history-model clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	@rm -f $(VENV)/.installed-*; touch $@

run: $(STAMP)
	$(BIN)/python -m services.stack

# Browser tests drive Debian's chromium (Playwright's own browser download does not work offline).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
		|| echo "chromium could not be installed: the browser tests will be skipped"

# Lint and types (configured in pyproject.toml): seconds, so every `make test` runs them first.
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Two pytest-xdist workers, each with stacks of its own; a module's tests stay on one worker (tests/conftest.py).
# Modules are handed out in the order collected, the end-to-end tier's long ones first (xdist's default order, by
# number of tests, would leave a one-minute test for last). `make test WORKERS=0`: every test in one process.
WORKERS ?= 2
XDIST := -n $(WORKERS) $(if $(filter-out 0,$(WORKERS)),--dist loadgroup --no-loadscope-reorder)

# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set (ignored by git): else every process the suite starts
# (each service, agent and CLI run of every stack) compiles the project's modules again, and each worker rewrites
# every test module's asserts again (about 1 s of CPU a stack start, 6 s a worker's collection).
test: $(STAMP) check browser
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -p no:cacheprovider --durations=15 $(XDIST)

test-fast: $(STAMP) check
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit tests/service

# Real CUDA jobs on this machine's NVIDIA GPUs: needs torch with CUDA and the `gpu` extra; skipped without a GPU,
# as `make test` skips them. Figures go to $(OUT)/gpu-report.json, else .trainmaster/gpu-report.json. A GPU
# machine without the venv: bench/gpu/run.sh.
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -rs -s tests/gpu

bench: bench-submit bench-sched bench-eta bench-reports bench-search bench-scale

bench-submit: $(STAMP)
	$(BIN)/python -m bench.submit --jobs 200 --idle 20

# N simulated agents against a fresh stack per fleet size, each run bounded (readiness 3 min, 2 min steady, a
# 500-job burst of at most 5 min): a Markdown table (README, Scale). `make bench-scale QUICK=1`: 500 and 1,000.
bench-scale: $(STAMP)
	nice $(BIN)/python -m bench.scale --sweep 500,1000,2000,5000,10000 --seconds 120 --jobs 500 $(if $(QUICK),--quick)

bench-reports: $(STAMP)
	$(BIN)/python -m bench.reports

# replays the recorded sweep (bench/search/data) and MLPerf groups through the search pruners
bench-search: $(STAMP)
	$(BIN)/python -m bench.search --out bench/search/results.json

MLPERF := ../shared/data/mlperf
bench-eta: $(STAMP)
	$(BIN)/python -m services.estimator.evaluate --split round --train $(MLPERF)/mlperf-training-v3.1.tar.gz \
		--test $(MLPERF)/mlperf-training-v4.0.tar.gz --out bench/eta/results/eval-round-v3.1-v4.0.json
	$(BIN)/python -m services.estimator.evaluate --train $(MLPERF)/mlperf-training-v3.1.tar.gz \
		$(MLPERF)/mlperf-training-v4.0.tar.gz --test $(MLPERF)/mlperf-training-v4.0.tar.gz --kfold 4 \
		--out bench/eta/results/eval-kfold4-v4.0.json
	$(BIN)/python -m services.estimator.evaluate --corpus own-jobs --out bench/eta/results/eval-own-jobs.json
	nice -n 10 $(BIN)/python -m services.estimator.evaluate --corpus own-jobs --split family \
		--out bench/eta/results/eval-own-jobs-family.json
	$(BIN)/python -m bench.eta.bench_online
	$(BIN)/python -m bench.eta.bench_online --own-jobs --jobs 5
	$(BIN)/python -m bench.eta.bench_history

# The own-job curve prior (services/estimator/model/curveprior): pre-training on synthetic curves from seed 0 (one
# niced core, at most 20 min: UNTIL=HH:MM UTC stops it sooner), then fine-tuning on the recorded runs' seeds 0-2, then
# the leave-one-family-out folds (ownnested): the fitted curve (owncurve.json) and the blend table (blend.json),
# each fold cached in .trainmaster/eta-cache; JOBS=N builds the folds in N processes (the same files).
eta-prior: $(STAMP)
	OMP_NUM_THREADS=1 nice -n 10 $(BIN)/python -m services.estimator.model.curveprior.train pretrain --seed 0 \
		--curves 80000 --epochs 40 $(if $(UNTIL),--until $(UNTIL))
	OMP_NUM_THREADS=1 nice -n 10 $(BIN)/python -m services.estimator.model.curveprior.train finetune --epochs 6
	OMP_NUM_THREADS=1 nice -n 10 $(BIN)/python -m services.estimator.ownbuild --cache .trainmaster/eta-cache \
		$(if $(JOBS),--jobs $(JOBS))

# The history model a fresh install serves (services/estimator/model/history-shipped.npz and its provenance): trained
# from the MLPerf logs by the code beside it (~1.5 min of one core); a unit test fails when it is not current.
history-model: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m services.estimator.shipped --corpus $(MLPERF)

TRACE := ../shared/data/alibaba-gpu-v2023
bench-sched: $(STAMP)
	PYTHONPATH=. nice $(BIN)/python bench/sched/matrix.py --data $(TRACE) --workers 2
	PYTHONPATH=. $(BIN)/python bench/sched/decision_time.py

clean:
	rm -rf $(VENV) .trainmaster
