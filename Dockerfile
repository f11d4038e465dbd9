# syntax=docker/dockerfile:1
#
# fleet-limiter gateway image: see docs/deploy.md.
#
#   docker build -t fleet-limiter .
#   docker run --rm -p 8080:8080 -e FLEET_LIMITER_UPSTREAM=http://api.internal:3000 fleet-limiter
#
# The runtime image has no shell and no package manager. The configuration file is
# /etc/fleet-limiter/fleet-limiter.toml (mount your own over it); FLEET_LIMITER_* variables
# override it, and flags after the image name replace the default command.

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
# Only its statically linked busybox is used, as the health probe's HTTP client.
ARG PROBE_IMAGE=busybox:1.36.1-musl

FROM ${PROBE_IMAGE} AS probe

FROM ${RUST_IMAGE} AS builder
WORKDIR /src

# Dependencies first, in layers of their own: they are fetched and compiled again only when
# Cargo.toml or Cargo.lock change, not on every change to the sources.
COPY Cargo.toml Cargo.lock ./
COPY benches ./benches
RUN mkdir src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && cargo fetch --locked \
 && cargo build --release --locked --bin fleet-limiter \
 && rm -rf src

COPY src ./src
# The placeholder build left newer artefacts than the copied sources: make cargo see them as new.
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked --offline --bin fleet-limiter \
 && install -D -m 0755 target/release/fleet-limiter /out/fleet-limiter

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="fleet-limiter" \
      org.opencontainers.image.description="Principal-keyed rate limiter for agent-fleet HTTP APIs" \
      org.opencontainers.image.licenses="MIT OR Apache-2.0"

COPY --from=builder /out/fleet-limiter /usr/local/bin/fleet-limiter
# Named wget, busybox runs only its wget applet: the probe below, nothing else.
COPY --from=probe /bin/busybox /usr/local/libexec/fleet-limiter/wget
COPY deploy/docker/fleet-limiter.toml /etc/fleet-limiter/fleet-limiter.toml

# distroless's nonroot user (65532); nothing in the image is writable by it, and nothing needs to be.
USER 65532:65532

# Traffic (server.listen) and the admin listener (ops.admin_listen: /metrics, /healthz,
# /readyz, POST /reload). Publish the admin port only on a private network.
EXPOSE 8080 7391

# The admin listener's liveness answer. The probe is exec form (there is no shell) and so
# names the admin port as written in deploy/docker/fleet-limiter.toml: a configuration that
# moves ops.admin_listen needs a matching --health-cmd (docs/deploy.md).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["/usr/local/libexec/fleet-limiter/wget", "-q", "-T", "2", "-O", "/dev/null", "http://127.0.0.1:7391/healthz"]

# SIGTERM fails /readyz at once, keeps accepting for ops.drain_delay (5 s by default), then
# drains in-flight requests for ops.shutdown_grace (30 s by default) and exits 0: give
# `docker stop` a longer timeout (-t 40, compose's stop_grace_period). SIGHUP reloads.
# The gateway is PID 1 here and handles both itself; it starts no child processes.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/fleet-limiter"]
CMD ["serve", "--config", "/etc/fleet-limiter/fleet-limiter.toml"]
