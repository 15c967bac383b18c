# Builds both binaries into one small image; docker-compose.yml picks the command.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
# go.mod replaces the client module with ./client: go mod download reads its go.mod.
COPY client/go.mod ./client/
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -o /out/quotaplane-api ./cmd/api && \
    CGO_ENABLED=0 go build -o /out/quotaplane-worker ./cmd/worker && \
    mkdir -p /state

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
# The demo seed's state directory, the nonroot user's: docker-compose.yml mounts a named
# volume here, which takes this owner when first created (the root filesystem is read-only).
COPY --from=build --chown=nonroot:nonroot /state /var/lib/quotaplane
EXPOSE 8080 8081 8082
ENTRYPOINT ["/usr/local/bin/quotaplane-api"]
