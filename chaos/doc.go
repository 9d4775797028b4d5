// Package chaos holds the network chaos suite (its tests only): PostgreSQL
// and two or three hosts, each in a network namespace of its own, joined
// through a TCP proxy of the suite's that delays, stalls, drops and resets
// connections. `make chaos` runs it, as root; `go test ./...` does not (its
// TestMain runs nothing unless TASKHOST_CHAOS=1). See README.md, "Chaos".
package chaos
