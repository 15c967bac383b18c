// Package leasetest holds the tests that kill api replicas (real processes, kill -9)
// while they hold leases on a hot path, and check what the clients were told against
// what was counted (docs/ARCHITECTURE.md "Leases").
package leasetest
