// Package k8s holds Quotaplane's Kubernetes manifests (the YAML files beside this
// one, applied with kubectl apply -k) and no code. Its tests decode every manifest
// strictly into the Kubernetes API types, so a misspelled field fails, and check what
// a decode cannot: probes on paths the binaries serve, ports equal to their listen
// addresses, selectors that select, and environment variables the binaries read.
//
// It is a Go module of its own so that the main module's go test ./... does not
// compile k8s.io/api.
package k8s
