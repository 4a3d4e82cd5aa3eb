# Builds the connector as a static binary and ships it on a small base. Only
# ./cmd/connector is built: the demo (./cmd/connector-demo) embeds brokers
# and has no place in the image.
#
# Both base images are arguments so that the image can be built where no
# image registry is reachable: scripts/compose-test passes images it made
# itself. With no arguments, the public images below are used.
ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=alpine:3.20

# The runtime without the binary. The default target below adds the binary
# built from source; scripts/compose-test builds this target alone
# (--target runtime) and adds a binary it built with the host's Go, since
# the build stage needs the Go module proxy, which no container reaches.
FROM ${RUNTIME_IMAGE} AS runtime
# The user is written into /etc/passwd directly because the bases differ in
# their tools (Alpine has adduser, Debian's minimal base only useradd).
# The state directory holds the generated identities of hosted weida
# endpoints (their fingerprints are what subscribers pin) and the stateless
# reset key. run uses it by default; mount a volume on it so that both
# survive a new container.
RUN echo 'connector:x:10001:10001:weida connector:/nonexistent:/sbin/nologin' >>/etc/passwd \
 && echo 'connector:x:10001:' >>/etc/group \
 && mkdir -p /var/lib/weida-connector \
 && chown connector:connector /var/lib/weida-connector \
 && chmod 0700 /var/lib/weida-connector
ARG VERSION=
ARG REVISION=
LABEL org.opencontainers.image.title="weida-connector" \
      org.opencontainers.image.description="Bridges MQTT 5, NATS and AMQP 0-9-1 topics onto weida Pub/Sub endpoints" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# The admin listener (/metrics, /healthz, /readyz, /status) at run's default
# address. The weida endpoints' UDP ports are whatever the resources name,
# so they are published per deployment, not declared here.
EXPOSE 9090/tcp
# The image has no HTTP client: the binary probes its own admin listener.
# A container started with another --admin overrides this (compose does).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["connector", "health", "--admin", "127.0.0.1:9090"]
VOLUME /var/lib/weida-connector
USER connector
ENTRYPOINT ["connector"]
CMD ["run", "-f", "/etc/connector"]

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# .git is not sent to the builder, so the binary names its version only
# through VERSION (docker build --build-arg VERSION=$(git describe --tags --always --dirty)).
ARG VERSION=
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/connector ./cmd/connector

# The default target: built from source with the Go image.
FROM runtime
COPY --from=build /out/connector /usr/local/bin/connector
