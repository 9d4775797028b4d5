package local

import (
	"path/filepath"
	"testing"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/brokertest"
)

// openTest opens a broker on a fresh file in t's temporary directory and
// closes it when t ends.
func openTest(t testing.TB, opts Options) *Broker {
	t.Helper()
	if opts.Path == "" {
		opts.Path = filepath.Join(t.TempDir(), "data", "taskhost.db")
	}
	b, err := Open(t.Context(), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) broker.Broker {
		return openTest(t, Options{})
	})
}
