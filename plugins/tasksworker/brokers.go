package tasksworker

// The one place that maps the broker setting to an implementation.

import (
	"context"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/broker/postgres"
)

// LocalDBFile is the local broker's database file inside data_dir.
const LocalDBFile = "taskhost.db"

// openBroker is the one place that maps the broker setting to an
// implementation. It checks everything it can before the caller stops the
// running broker, and returns the function that opens the new one.
func openBroker(cfg Config, log hclog.Logger) (func(ctx context.Context) (broker.Broker, error), error) {
	switch cfg.Broker {
	case "memory":
		return func(context.Context) (broker.Broker, error) { return memory.New(), nil }, nil
	case "local":
		path := filepath.Join(cfg.DataDir, LocalDBFile)
		return func(ctx context.Context) (broker.Broker, error) {
			return local.Open(ctx, local.Options{
				Path:       path,
				LiveAfter:  cfg.Reaper.After,
				WorkerTTL:  cfg.Reaper.WorkerTTL,
				MaxPayload: cfg.MaxPayloadBytes,
				Logger:     log.Named("local"),
			})
		}, nil
	case "postgres":
		return func(ctx context.Context) (broker.Broker, error) {
			return postgres.New(ctx, postgres.Options{
				DSN:        cfg.DSN,
				Schema:     cfg.Schema,
				LiveAfter:  cfg.Reaper.After,
				WorkerTTL:  cfg.Reaper.WorkerTTL,
				MaxPayload: cfg.MaxPayloadBytes,
				Logger:     log.Named("postgres"),
			})
		}, nil
	}
	return nil, invalid("broker", "unknown broker %q; use one of %s", cfg.Broker, strings.Join(brokerKinds, ", "))
}
