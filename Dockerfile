# lance-context server image (multi-stage). Build from the repository root:
#   docker build -t lance-context .
# The build stage compiles the release binary, the built-in plugins with it
# (crates/host/build.rs builds plugins/ for wasm32-wasip2, the target
# rust-toolchain.toml pins). The runtime stage holds the binary alone.
# See docs/operations.md.

FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# rust-toolchain.toml names the toolchain (the image's own, 1.95.0) and
# the wasm target the plugins build for; rustup does not add a target to
# a toolchain already installed, so it is added here.
RUN rustup target add wasm32-wasip2 \
 && cargo build --release --locked -p lance-context-cli --bin lance-context \
 && cp target/release/lance-context /usr/local/bin/lance-context

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --create-home --home-dir /home/lance lance \
 && mkdir -p /data \
 && chown lance /data
COPY --from=build /usr/local/bin/lance-context /usr/local/bin/lance-context
USER 10001
ENV HOME=/home/lance
# The data root (the registry; stores created without a uri) and the
# compile cache of plugin components.
VOLUME ["/data"]
EXPOSE 8080
ENTRYPOINT ["lance-context"]
CMD ["serve", "--root", "/data", "--addr", "0.0.0.0:8080", "--tokens", "/etc/lance-context/tokens.json"]
