package tasksworker

// The one place that maps the broker setting to an implementation.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/broker/rabbitmq"
)

// LocalDBFile is the local broker's database file inside data_dir.
const LocalDBFile = "taskhost.db"

// brokerEvents counts what the rabbitmq broker reports for the plugin's
// series: the deliveries it moves aside (rabbitmq.Options.Rejected) and
// the messages it publishes again (rabbitmq.Options.Republished), by
// reason.
type brokerEvents interface {
	Rejected(reason string)
	Republished(reason string, n int)
}

// leasingBroker is a broker that also elects the beat's leader: every
// broker the config can name is one.
type leasingBroker interface {
	broker.Broker
	broker.Leaser
}

// openBroker is the one place that maps the broker setting to an
// implementation. It checks everything it can before the caller stops the
// running broker, and returns the function that opens the new one.
func openBroker(cfg Config, log hclog.Logger, events brokerEvents) (func(ctx context.Context) (leasingBroker, error), error) {
	switch cfg.Broker {
	case "memory":
		return func(context.Context) (leasingBroker, error) { return memory.New(), nil }, nil
	case "local":
		return func(ctx context.Context) (leasingBroker, error) { return openLocal(ctx, cfg, log) }, nil
	case "postgres":
		return func(ctx context.Context) (leasingBroker, error) { return openPostgres(ctx, cfg, log) }, nil
	case "rabbitmq":
		return func(ctx context.Context) (leasingBroker, error) { return openRabbitMQ(ctx, cfg, log, events) }, nil
	}
	return nil, invalid("broker", "unknown broker %q; use one of %s", cfg.Broker, strings.Join(brokerKinds, ", "))
}

func openLocal(ctx context.Context, cfg Config, log hclog.Logger) (*local.Broker, error) {
	return local.Open(ctx, local.Options{
		Path:       filepath.Join(cfg.DataDir, LocalDBFile),
		LiveAfter:  cfg.Reaper.After,
		WorkerTTL:  cfg.Reaper.WorkerTTL,
		MaxPayload: cfg.MaxPayloadBytes,
		Logger:     log.Named("local"),
	})
}

func openPostgres(ctx context.Context, cfg Config, log hclog.Logger) (*postgres.Broker, error) {
	return postgres.New(ctx, postgres.Options{
		DSN:        cfg.DSN,
		Schema:     cfg.Schema,
		LiveAfter:  cfg.Reaper.After,
		WorkerTTL:  cfg.Reaper.WorkerTTL,
		MaxPayload: cfg.MaxPayloadBytes,
		Logger:     log.Named("postgres"),
	})
}

// openRabbitMQ opens the state store the config names (the local or the
// postgres store, with the same settings as that broker), then the
// rabbitmq broker over it; the broker closes the store.
func openRabbitMQ(ctx context.Context, cfg Config, log hclog.Logger, events brokerEvents) (*rabbitmq.Broker, error) {
	var state rabbitmq.StateStore
	var err error
	switch cfg.StateStore {
	case "postgres":
		state, err = openPostgres(ctx, cfg, log)
	default:
		state, err = openLocal(ctx, cfg, log)
	}
	if err != nil {
		return nil, fmt.Errorf("the %s state store: %w", cfg.StateStore, err)
	}
	b, err := rabbitmq.Open(ctx, rabbitmq.Options{
		URL:           cfg.AMQPURL,
		Prefix:        cfg.AMQPPrefix,
		Heartbeat:     amqpHeartbeat(cfg.HeartbeatInterval),
		State:         state,
		DeliveryLimit: cfg.Reaper.MaxAttempts,
		MaxPayload:    cfg.MaxPayloadBytes,
		Logger:        log.Named("rabbitmq"),
		Rejected:      events.Rejected,
		Republished:   events.Republished,
	})
	if err != nil {
		_ = state.Close()
		var taken *rabbitmq.PrefixTakenError
		if errors.As(err, &taken) {
			// Retrying cannot help: the config, or the queue the error
			// names, must change first.
			return nil, invalid("amqp_prefix", "%s", taken.Error())
		}
		return nil, err
	}
	return b, nil
}

// amqpHeartbeat is the AMQP heartbeat for the worker's heartbeat interval:
// the same, in whole seconds (the protocol's unit), at least one.
func amqpHeartbeat(interval time.Duration) time.Duration {
	return max(interval.Round(time.Second), time.Second)
}
