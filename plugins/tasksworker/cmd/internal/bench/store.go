package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/broker/postgres"
)

// open opens the broker under test and returns what undoes it.
func (bn *bench) open(ctx context.Context) (func(), error) {
	cfg := bn.cfg
	switch cfg.kind {
	case "memory":
		bn.b = memory.New()
		return func() { _ = bn.b.Close() }, nil

	case "local":
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

	// postgres
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
// same state.
func (bn *bench) reset(ctx context.Context) error {
	if bn.admin == nil {
		return nil
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
	_, _ = bn.admin.Exec(ctx, `CHECKPOINT`) // superusers and pg_checkpoint only
	return nil
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
