# Every target sets up its own environment: a fresh clone needs only `make test` or `make demo`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

SEEDS ?= 500
ITER  ?= 50
RUNS  ?= 20
TIME  ?= 60
LANES ?= 1

.PHONY: help setup lint format typecheck pytest pytest-long test upgrade-test test-launchers test-browser sim crash-test fuzz bench-wal bench-kv bench-failover bench-recovery bench-scale bench-store bench-transport bench-ettr bench-peers bench-replicas demo proto clean jepsen jepsen-long

help:
	@echo "make demo             start a local cluster and elastic workers, kill things, watch recovery"
	@echo "make test             lint (ruff, import layers), type-check (mypy), the tests (pytest), then make jepsen"
	@echo "make pytest-long      the tests CI runs in a short form (marked slow), at full size (RALLYPOINT_SLOW=1)"
	@echo "make test-browser     the dashboard in headless Chromium (installs chromium and chromium-driver, root)"
	@echo "make sim SEEDS=N      run the seeded Raft cluster simulator over N seeds"
	@echo "make crash-test ITER=N  SIGKILL a WAL writer N times and check nothing acknowledged is lost"
	@echo "make fuzz TIME=S      fuzz every RPC of both ports of a 3-member cluster for S s (default 60)"
	@echo "make bench-wal        WAL append/fsync benchmark -> bench/results/wal.json"
	@echo "make bench-kv         KV put/get/keep-alive vs a 3-member etcd -> bench/results/kv.json (.png)"
	@echo "make bench-failover   leader kill -9 / restart+kill / SIGSTOP -> first write, vs etcd -> bench/results/failover.json (.png)"
	@echo "make bench-recovery   worker SIGKILL -> training again vs torchrun; restore vs DCP -> bench/results/recovery.json (.png)"
	@echo "make bench-torchrun   torchrun kill-to-running, rallypoint vs c10d -> bench/results/torchrun.json"
	@echo "make bench-rendezvous rounds of 64/256/1024 vs torchrun, detection, capacity -> bench/results/rendezvous.json (.png)"
	@echo "make bench-scale      100k participants, batched heartbeats: rounds, bytes, detection, capacity -> bench/results/scale.json (.png)"
	@echo "make bench-transport  one message through grpc.aio (unary, peer-style stream), plain TCP and the peer transport -> bench/results/transport.json (.png)"
	@echo "make bench-store      gloo/NCCL bootstrap of 64/256/1024 ranks: bridge, CoordinatorStore vs TCPStore -> bench/results/store.json (.png)"
	@echo "make bench-ettr       effective training time at 16,384 GPUs (Llama 3's interruptions), modelled -> bench/results/ettr.json (.png)"
	@echo "make bench-replicas   a sharded model restored from the survivors' replicas: bytes/s, steps rolled back -> bench/results/replicas.json"
	@echo "make bench-peers      plain DDP, torchft 0.2.0 and rallypoint: steady step, kill stall, rejoin -> bench/results/peers.json (.png)"
	@echo "make test-launchers   Lightning, Accelerate, TorchX, Kubeflow, Slurm jobs: a worker killed, recovered (~6-11 min)"
	@echo "make proto            regenerate the Python code for proto/**/*.proto"
	@echo "make jepsen           fault-injection runs: every workload under every nemesis, short (root)"
	@echo "make jepsen-long RUNS=N TIME=S [LANES=L]  N runs of S s per fault mix, L at once -> store/jepsen/"
	@echo "make upgrade-test     a rolling upgrade from the previous release (commit f771d74) under the workloads, then back and forth (root)"

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0 numpy
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP) .pkgview/rallypoint

# mypy cannot follow setuptools' editable-install path mapping, so it checks a view of the
# import package made of symlinks to the top-level folders (see docs/architecture.md, "How the package is built").
.pkgview/rallypoint:
	mkdir -p .pkgview/rallypoint
	for pkg in raft coordinator client worker proto; do ln -sfn ../../$$pkg .pkgview/rallypoint/$$pkg; done

# lint-imports checks the import layers (pyproject.toml, [tool.importlinter]) on the same view
# of the package as mypy.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PYTHONPATH=.pkgview $(VENV)/bin/lint-imports --no-cache

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: setup
	$(VENV)/bin/mypy -p rallypoint

pytest: setup
	$(VENV)/bin/pytest -q

# CI runs a short form of each test that would need minutes (fewer systems, seeds, kills or a
# shorter window: the same claim); RALLYPOINT_SLOW=1 selects the long forms, which are marked
# slow. The simulator, the crash loop and the fuzzer have their own targets for longer runs.
pytest-long: setup
	RALLYPOINT_SLOW=1 $(VENV)/bin/pytest -q -m slow

# The fault-injection suite needs root (network namespaces, iptables); CI runs as root.
test: lint typecheck pytest
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory jepsen; \
	else echo "make test: the fault-injection suite needs root; run 'sudo make jepsen'"; fi

# Each launcher of docs/launchers/ runs a 2-node x 2-process job against a local cluster, a
# worker is SIGKILLed and the job must recover through rallypoint (tests/launchers; make test
# runs only their fast checks). Last line: launchers: N passed, M failed. ~6-11 minutes.
test-launchers: setup
	$(PY) -m tests.launchers.run

# The dashboard in headless Chromium against a real cluster and workers (make test runs it
# too). Installs Debian's chromium and chromium-driver when missing (needs root).
test-browser: setup
	command -v chromium >/dev/null && command -v chromedriver >/dev/null \
		|| (apt-get update && apt-get install -y chromium chromium-driver)
	$(VENV)/bin/pytest -q -m browser tests/dashboard

sim: setup
	$(PY) -m tests.sim --seeds $(SEEDS)

crash-test: setup
	$(PY) -m tests.crash --iterations $(ITER)

# Generated and mutated requests for every RPC of both services, without the token, with it,
# and as a member gone wrong; then the cluster must be whole. Last line: N messages, C failures.
fuzz: setup
	$(PY) -m tests.fuzz --time $(TIME)

bench-wal: setup
	$(PY) bench/wal_bench.py --out bench/results/wal.json

# Installs Debian's etcd (the anchor) if missing, then runs both systems in one run.
bench-kv: setup
	command -v etcd >/dev/null || (apt-get update && apt-get install -y etcd-server etcd-client)
	$(PY) -m bench.kv_bench --out bench/results/kv.json

# Leader failures (kill -9, restart then kill, SIGSTOP) until the next write, against a
# 3-member etcd in the same run, each at its default timing; installs etcd if missing. ~8 min.
bench-failover: setup
	command -v etcd >/dev/null || (apt-get update && apt-get install -y etcd-server etcd-client)
	$(PY) -m bench.failover_bench --out bench/results/failover.json

# Fault injection with real processes in network namespaces (needs root, iptables and
# libfaketime: installed from Debian's packages when missing). Reports under store/jepsen/.
JEPSEN_TOOLS = command -v iptables >/dev/null && test -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 \
	|| (apt-get update && apt-get install -y iptables faketime)

jepsen: setup
	@$(JEPSEN_TOOLS)
	$(PY) -m tests.jepsen --matrix short

jepsen-long: setup
	@$(JEPSEN_TOOLS)
	$(PY) -m tests.jepsen --matrix long --runs $(RUNS) --time $(TIME) --lanes $(LANES)

# Three members of the previous release (commit f771d74 on the stream peer transport,
# extracted with git: needs a full clone) upgraded one at a time to this checkout under the
# fault-injection workloads, the newest feature used after, then a member taken back to the
# previous release and forward again, with every key each time; ~2 min.
# The last line: upgrade: N steps, V violations, S stalls. `make pytest` runs a short form.
upgrade-test: setup
	@$(JEPSEN_TOOLS)
	$(PY) -m tests.upgrade --time 45

# Rendezvous at 64/256/1024 workers and torchrun's c10d rendezvous in one run; ~10 minutes.
bench-rendezvous: setup
	$(PY) -m bench.rendezvous_bench --out bench/results/rendezvous.json

# One 3-member cluster and load processes playing up to 100,000 participants on batched
# heartbeat streams: round close, round-change bytes, detection, capacity at 1 Hz; <= 30 minutes.
bench-scale: setup
	$(PY) -m bench.scale_bench --out bench/results/scale.json

# Process-group bootstrap (gloo's full mesh, NCCL's id broadcast and barrier) replayed by
# simulated ranks at 64/256/1024 through the TCPStore bridge and the round store, against
# torch's TCPStore server; a real 16-process init_process_group("gloo") through both. ~30 min.
bench-store: setup
	$(PY) -m bench.store_bench --out bench/results/store.json

# What one message costs through grpc.aio (an empty unary call; a client-stream ping-pong as the
# peer transport uses) against plain TCP on uvloop, with no Raft or disk behind it; ~15 s.
bench-transport: setup
	$(PY) -m bench.transport_bench --out bench/results/transport.json

# Two torchrun agents x 2 gloo workers (--nnodes=1:3) per trial; SIGKILL a worker of the
# second agent after 60 steps; both backends, 10 trials each (--trials); ~35 min (a c10d trial
# that does not recover waits 120 s).
bench-torchrun: setup
	$(PY) -m bench.torchrun_bench --out bench/results/torchrun.json

# A seeded simulation of a 16,384-GPU job over 54 days with Llama 3's interruptions, each
# system's recovery built from bench/results/*.json and cited figures; < 1 min, no processes.
bench-ettr: setup
	$(PY) -m bench.ettr_bench --out bench/results/ettr.json

# A dp=2 x tp=2 job replicated over dp: newcomers restored from the survivors' replicas; ~30 s.
bench-replicas: setup
	$(PY) -m bench.replica_bench --out bench/results/replicas.json

# The same 4-process MLP under plain DDP, torchft 0.2.0 (default and 1 s heartbeat) and rallypoint, trials alternating; ~8-12 min.
bench-peers: setup
	$(PY) -m bench.peers_bench --out bench/results/peers.json

# Regenerate the Python code for proto/**/*.proto (tests/proto checks it is fresh).
proto: setup
	$(PY) proto/generate.py

# Starts 3 members and 4 workers (temporary directories), kills things, exits 0; ~1 minute.
demo: setup
	$(PY) -m rallypoint.worker.demo

# SIGKILL-to-training recovery vs torchrun (tuned and default), restore vs raw DCP.
bench-recovery: setup
	$(PY) -m bench.recovery_bench --out bench/results/recovery.json

clean:
	rm -rf $(VENV) .pkgview .mypy_cache .pytest_cache .ruff_cache
