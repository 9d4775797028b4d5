package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/broker/rabbitmq"
	"github.com/taskhost/taskhost/plugins/tasksworker"
)

// errUnknownBroker is a -broker that open has no case for.
var errUnknownBroker = errors.New("unknown broker")

// open opens the broker -broker names and returns what undoes it. It is
// the one place that maps -broker to a broker: another broker is one more
// case here.
func (bn *bench) open(ctx context.Context) (func(), error) {
	switch bn.cfg.kind {
	case "memory":
		bn.b = memory.New()
		return func() { _ = bn.b.Close() }, nil
	case "local":
		return bn.openLocal(ctx)
	case "postgres":
		return bn.openPostgres(ctx)
	case "rabbitmq":
		return bn.openRabbitMQ(ctx)
	}
	return nil, fmt.Errorf("%w %q: use memory, local, postgres or rabbitmq", errUnknownBroker, bn.cfg.kind)
}

// openRabbitMQ opens the rabbitmq broker ($TASKHOST_AMQP_URL, else the
// local RabbitMQ as guest) under a queue prefix of its own, over a
// postgres state store opened as for -broker postgres; its queues are
// deleted at the end.
func (bn *bench) openRabbitMQ(ctx context.Context) (func(), error) {
	undoState, err := bn.openPostgres(ctx)
	if err != nil {
		return nil, err
	}
	url := cmp.Or(os.Getenv(tasksworker.AMQPURLEnv), rabbitmq.DefaultURL)
	b, err := rabbitmq.Open(ctx, rabbitmq.Options{URL: url, State: bn.b.(*postgres.Broker), Prefix: "bench" + bn.runTag, Logger: bn.log.Named("rabbitmq")})
	if err != nil {
		undoState()
		return nil, err
	}
	bn.b = b // closing it closes the state store
	return func() {
		queues, exchanges := b.Queues(), b.Exchanges()
		undoState()
		if err := deleteAMQP(url, queues, exchanges); err != nil {
			fmt.Fprintf(os.Stderr, "host bench: deleting the bench's queues: %v\n", err)
		}
	}, nil
}

// deleteAMQP deletes the queues and exchanges a bench run declared.
func deleteAMQP(url string, queues, exchanges []string) error {
	c, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return err
	}
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return err
		}
	}
	for _, e := range exchanges {
		if err := ch.ExchangeDelete(e, false, false); err != nil {
			return err
		}
	}
	return nil
}

// openLocal opens the local broker on a database file of its own.
func (bn *bench) openLocal(ctx context.Context) (func(), error) {
	cfg := bn.cfg
	dir, made := cfg.dataDir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "taskhost-bench-")
		if err != nil {
			return nil, err
		}
		dir, made = d, true
	}
	path := filepath.Join(dir, "bench-"+bn.runTag+".db")
	bn.schema = path
	b, err := local.Open(ctx, local.Options{Path: path, Logger: bn.log.Named("local")})
	if err != nil {
		if made {
			_ = os.RemoveAll(dir)
		}
		return nil, err
	}
	bn.b = b
	return func() {
		_ = b.Close()
		switch {
		case cfg.keep:
			fmt.Fprintf(bn.out, "kept the database file %s\n", path)
		case made:
			_ = os.RemoveAll(dir)
		default:
			for _, suffix := range []string{"", "-wal", "-shm"} {
				_ = os.Remove(path + suffix)
			}
		}
	}, nil
}

// openPostgres opens the postgres broker on the bench's schema (a fresh
// one unless -schema), with a connection of its own pointed at it.
func (bn *bench) openPostgres(ctx context.Context) (func(), error) {
	cfg := bn.cfg
	schema := cfg.schema
	if schema == "" {
		schema = "tw_bench_" + randomHex(6)
	}
	admin, err := pgx.Connect(ctx, cfg.dsn)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", redactedDSN(cfg.dsn), err)
	}
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
		_ = admin.Close(ctx)
		return nil, err
	}
	// The bench empties the tables between runs: it never works in a
	// schema it did not make.
	if exists && !strings.HasPrefix(schema, "tw_bench_") {
		_ = admin.Close(ctx)
		return nil, fmt.Errorf("schema %s exists: the bench empties and drops its schema, so give it a new name (or one starting with tw_bench_, made by an earlier -keep run)", schema)
	}
	bn.schema = schema
	undo := func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if bn.b != nil {
			_ = bn.b.Close()
		}
		if admin.IsClosed() {
			// An interrupted query closes its connection: drop the
			// schema through a new one.
			if c, err := pgx.Connect(cctx, cfg.dsn); err == nil {
				admin = c
			}
		}
		if cfg.keep {
			fmt.Fprintf(bn.out, "kept schema %s\n", schema)
		} else if _, err := admin.Exec(cctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			fmt.Fprintf(os.Stderr, "host bench: dropping schema %s: %v\n", schema, err)
		}
		_ = admin.Close(cctx)
	}
	b, err := postgres.New(ctx, postgres.Options{DSN: cfg.dsn, Schema: schema, Logger: bn.log.Named("postgres")})
	if err != nil {
		undo()
		return nil, err
	}
	bn.b = b
	if _, err := admin.Exec(ctx, `SET search_path TO `+pgx.Identifier{schema}.Sanitize()); err != nil {
		undo()
		return nil, err
	}
	bn.admin = admin
	return undo, nil
}

// reset empties the message table (postgres), so each run starts from the
// same state; the reports kept in its rows move to tw_report_rows first.
func (bn *bench) reset(ctx context.Context) error {
	if bn.admin == nil {
		return nil
	}
	if _, err := bn.admin.Exec(ctx, postgres.MoveHeldReportsSQL); err != nil {
		return err
	}
	_, err := bn.admin.Exec(ctx, `TRUNCATE tw_messages, tw_locks`)
	return err
}

// settle gives the planner fresh statistics and flushes dirty pages after a
// seed (postgres; untimed, as River's harness does after its prefill).
func (bn *bench) settle(ctx context.Context) error {
	if bn.admin == nil {
		return nil
	}
	if _, err := bn.admin.Exec(ctx, `ANALYZE tw_messages`); err != nil {
		return err
	}
	bn.checkpoint(ctx)
	return nil
}

// checkpoint flushes dirty pages (postgres; superusers and pg_checkpoint
// only: for anyone else it does nothing).
func (bn *bench) checkpoint(ctx context.Context) {
	if bn.admin != nil {
		_, _ = bn.admin.Exec(ctx, `CHECKPOINT`)
	}
}

func (bn *bench) topic(phase string, run int) string {
	return fmt.Sprintf("bench-%s-%s-%d", bn.runTag, phase, run)
}

func (bn *bench) setLimit(ctx context.Context, topic string) error {
	limit := bn.cfg.limit
	_, err := bn.b.SetTopic(ctx, topic, broker.TopicPatch{ConcurrencyLimit: &limit})
	return err
}

// openSchema opens a second PostgreSQL broker on a fresh schema, with a
// connection of its own pointed at it, and returns what undoes both.
func (bn *bench) openSchema(ctx context.Context, schema string) (broker.Broker, *pgx.Conn, func(), error) {
	cfg := bn.cfg
	var exists bool
	if err := bn.admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
		return nil, nil, nil, err
	}
	if exists && !strings.HasPrefix(schema, "tw_bench_") {
		return nil, nil, nil, fmt.Errorf("schema %s exists: the bench empties and drops its schemas, so give -schema a new name", schema)
	}
	b, err := postgres.New(ctx, postgres.Options{DSN: cfg.dsn, Schema: schema, Logger: bn.log.Named("postgres")})
	if err != nil {
		return nil, nil, nil, err
	}
	drop := func() {
		_ = b.Close()
		if cfg.keep {
			fmt.Fprintf(bn.out, "kept schema %s\n", schema)
			return
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := bn.admin.Exec(cctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			fmt.Fprintf(os.Stderr, "host bench: dropping schema %s: %v\n", schema, err)
		}
	}
	admin, err := pgx.Connect(ctx, cfg.dsn)
	if err != nil {
		drop()
		return nil, nil, nil, err
	}
	undo := func() {
		_ = admin.Close(context.Background())
		drop()
	}
	if _, err := admin.Exec(ctx, `SET search_path TO `+pgx.Identifier{schema}.Sanitize()); err != nil {
		undo()
		return nil, nil, nil, err
	}
	if _, err := admin.Exec(ctx, `TRUNCATE tw_messages, tw_locks`); err != nil {
		undo()
		return nil, nil, nil, err
	}
	return b, admin, undo, nil
}

// finished counts topic's messages that are done and the success reports
// of topic (postgres): the database's own account of a phase.
func (bn *bench) finished(ctx context.Context, topic string) (done, reports int64, err error) {
	err = bn.admin.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM tw_messages_all WHERE topic = $1 AND state = 'done'),
		(SELECT count(*) FROM tw_reports WHERE topic = $1 AND status = $2)`, topic, broker.ReportSuccess).Scan(&done, &reports)
	return done, reports, err
}

// checkReports verifies (postgres, unless -pool-only) that topic has a
// success report for each of its n done messages.
func (bn *bench) checkReports(ctx context.Context, topic string, n int) error {
	if bn.admin == nil || bn.cfg.poolOnly {
		return nil
	}
	done, reports, err := bn.finished(ctx, topic)
	if err != nil {
		return err
	}
	if done != int64(n) || reports != int64(n) {
		return fmt.Errorf("topic %s has %d messages done and %d success reports, want %d of each", topic, done, reports, n)
	}
	return nil
}
