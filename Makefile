# Set-up and the two commands of the README. Every target installs what it
# needs when it is missing, so a fresh machine needs nothing else.

CARGO ?= cargo
DATA ?= data/demo

.PHONY: demo test plugins test-plugins bench deps test-deps lint fmt

## The main job: the product end to end on a registry in a local directory.
## The same (dev-profile) build as `make test`'s binary: one build for both.
demo: deps
	$(CARGO) build -p lance-context-cli --bin lance-context
	$(CARGO) run -q -p lance-context-cli --bin lance-context -- demo --data $(DATA)

## Benchmarks (release build): adds, merge throughput and peak memory,
## point lookups with the key index vs a full scan, at 1M rows; record
## capabilities vs a plain store at 1M rows; disk use under retention.
bench: deps
	$(CARGO) run --release -p lance-context-cli --bin lance-context -- dev bench --data data/bench \
		--rows 1000000 --records-rows 1000000 --retention-merges 100

## The test suite: the host workspace (with the CLI binary its tests spawn),
## then the plugins workspace.
test: deps test-deps
	$(CARGO) build -p lance-context-cli --bin lance-context
	$(CARGO) test --workspace
	$(MAKE) test-plugins

## The guest side (plugins/, its own workspace): native unit tests, then the
## wasm32-wasip2 components.
test-plugins: deps
	$(CARGO) test --manifest-path plugins/Cargo.toml
	$(MAKE) plugins

plugins: deps
	$(CARGO) build --release --locked --target wasm32-wasip2 --manifest-path plugins/Cargo.toml

## Build prerequisites: protoc (Lance's protobuf build), the pinned toolchain.
deps:
	@command -v protoc >/dev/null 2>&1 || { \
		echo "installing protoc"; \
		(apt-get update -qq && apt-get install -y -qq protobuf-compiler) >/dev/null; }
	@command -v rustup >/dev/null 2>&1 && { \
		rustup show active-toolchain >/dev/null; \
		rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2; } || true

## Test prerequisites: moto's S3-compatible server (object-store tests run it
## on 127.0.0.1); it brings openapi-spec-validator, which checks the server's
## OpenAPI document.
test-deps:
	@python3 -c "import moto.server, flask, openapi_spec_validator" >/dev/null 2>&1 || { \
		echo "installing moto[server]"; \
		python3 -m pip install --quiet --disable-pip-version-check 'moto[server]>=5,<6'; }

lint: deps
	$(CARGO) fmt --all --check
	$(CARGO) fmt --all --check --manifest-path plugins/Cargo.toml
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --manifest-path plugins/Cargo.toml --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all
	$(CARGO) fmt --all --manifest-path plugins/Cargo.toml
