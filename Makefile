# Two entry points that work on a fresh machine with python3 and make only.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all fuzz conformance clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: executorch 1.5.1 does not declare it, and an unpinned
	# resolve would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The headline at real size (E=512): stock vs xnnfold vs the plain-linear rewrite, each variant
# lowered in its own process; about 2 min on 2 cores after install. Chart: out/report/*.png.
demo: $(STAMP)
	$(PY) -m xnnfold report --models cross-attention-512,decoder-layer-512 \
	    --variants stock,xnnfold,ideal --reps 20 --out out/report

# Two workers (pytest-xdist): the tests that share a module fixture run on one worker, which
# builds it once, the largest groups first (tests/worker_groups.py; --dist loadgroup).
# MALLOC_PERTURB_: glibc hands out heap memory filled with 0x5A, so what reads memory nothing
# wrote (a planned tensor no kernel filled, a model's uninitialized buffer) reads the same
# garbage in every test and fails there, not zeros in a young process and garbage in an old one.
test: $(STAMP)
	MALLOC_PERTURB_=165 $(PY) -m pytest -q -n 2 --dist loadgroup --durations=5 tests

# make test and the slow set (tests marked slow: more architectures and modes, the property
# test's second half); about 25 min on 2 idle cores.
test-all: $(STAMP)
	XNNFOLD_SLOW_TESTS=1 MALLOC_PERTURB_=165 $(PY) -m pytest -q -n 2 --dist loadgroup \
	    --durations=5 tests

# The property test's long profile: random (not derandomized), 1,000 examples by default, in two
# processes of half as many (one per core), each printing a progress line every 25 examples;
# every fold verified against the whole program. About 30 min on 2 idle cores.
FUZZ_EXAMPLES ?= 1000
fuzz: $(STAMP)
	@pids=""; for part in 1 2; do \
	    PYTHONWARNINGS=ignore XNNFOLD_FUZZ=$$part XNNFOLD_EXAMPLES=$$(( $(FUZZ_EXAMPLES) / 2 )) \
	        $(PY) -m pytest -q -s -p no:cacheprovider --hypothesis-show-statistics \
	        tests/test_property.py & pids="$$pids $$!"; \
	done; status=0; for pid in $$pids; do wait $$pid || status=1; done; exit $$status

# executorch's own XNNPACK tests (passes, ops, serialization, quantizer, partitioner, recipes and
# the models that import: 412 tests), stock and with xnnfold.XnnpackPartitioner swapped in by a
# pytest plugin; suite by suite, stock then xnnfold, one pytest process at a time: several hours
# on 2 cores (conformance/README.md). Writes out/conformance/summary.md after every suite;
# fails if the passing tests differ.
conformance: $(STAMP)
	$(PY) conformance/run.py

clean:
	rm -rf $(VENV) out .pytest_cache
