# Builds the connector as a static binary and ships it on a small base that
# has wget for the compose health check. Only ./cmd/connector is built: the
# demo (./cmd/connector-demo) embeds brokers and has no place in the image.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# .git is not sent to the builder, so the binary names its version only
# through VERSION (docker build --build-arg VERSION=$(git describe --tags --always --dirty)).
ARG VERSION=
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/connector ./cmd/connector

FROM alpine:3.20
# The state directory holds the generated identities of hosted weida
# endpoints (their fingerprints are what subscribers pin) and the stateless
# reset key. run uses it by default; mount a volume on it so that both
# survive a new container.
RUN adduser -D -H -u 10001 connector \
 && mkdir -p /var/lib/weida-connector \
 && chown connector:connector /var/lib/weida-connector \
 && chmod 0700 /var/lib/weida-connector
COPY --from=build /out/connector /usr/local/bin/connector
USER connector
VOLUME /var/lib/weida-connector
ENTRYPOINT ["connector"]
CMD ["run", "-f", "/etc/connector"]
