# syntax=docker/dockerfile:1
#
# tether's container image: a static binary (CGO_ENABLED=0) on distroless/static, running as
# the distroless "nonroot" user (65532). Nothing is written to the image's filesystem at run
# time, so it runs with a read-only root filesystem; mount the config at /etc/tether/tether.yaml
# and, if store.snapshotPath is set, a writable volume for it (the Helm chart mounts
# /var/lib/tether).
#
#   docker build -t tether:dev --build-arg VERSION=$(git describe --tags --always) .
#   docker run --read-only -v $PWD/tether.yaml:/etc/tether/tether.yaml:ro tether:dev
#
# Listeners in a container must bind 0.0.0.0 (or the pod IP), and an API listener off loopback
# needs auth.tokens: see deploy/helm/tether/values.yaml for a config that does both.

# GO_VERSION is the Go toolchain of the build stage (go.mod's go line).
ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH=amd64
# VERSION is what `tether version` prints.
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/tether ./cmd/tether

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/tether /usr/local/bin/tether
USER 65532:65532
# ext_proc (gRPC), xDS (gRPC), API (HTTP + gRPC health), SIP decision (HTTP).
EXPOSE 9002 18000 9000 9060
ENTRYPOINT ["/usr/local/bin/tether"]
CMD ["serve", "-c", "/etc/tether/tether.yaml"]
