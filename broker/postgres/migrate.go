package postgres

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
)

// The migrations: numbered .sql files, applied in order, each once.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

var migrationName = regexp.MustCompile(`^(\d+)_[a-z0-9_]+\.sql$`)

// migrations returns the embedded migrations by version.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	seen := make(map[int]string)
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %q is not named NNN_name.sql", e.Name())
		}
		v, err := strconv.Atoi(m[1])
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migration file %q: bad version", e.Name())
		}
		if other, ok := seen[v]; ok {
			return nil, fmt.Errorf("migrations %q and %q share version %d", other, e.Name(), v)
		}
		seen[v] = e.Name()
		body, err := fs.ReadFile(migrationFiles, path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: e.Name(), sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// Migrate brings the broker's tables in schema (created when missing;
// "" means "public") up to date: the command behind `host migrate`. New
// runs it too, so calling it first is optional. Safe to run from several
// processes at once.
func Migrate(ctx context.Context, dsn, schema string) error {
	cfg, schema, err := connConfig(dsn, schema)
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return connectError(cfg, err)
	}
	defer closeConn(conn)
	return migrate(ctx, conn, schema, hclog.NewNullLogger())
}

// migrationLock is the advisory lock key serialising migrations of one
// schema across processes.
func migrationLock(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("taskhost/broker/postgres migrations\x00" + schema))
	return int64(h.Sum64())
}

// migrate applies the pending migrations on conn, whose search_path is
// schema: one transaction per migration, each under the schema's advisory
// transaction lock, re-checking the version table once the lock is held.
func migrate(ctx context.Context, conn *pgx.Conn, schema string, log hclog.Logger) error {
	all, err := migrations()
	if err != nil {
		return fmt.Errorf("postgres broker: %w", err)
	}
	key := migrationLock(schema)
	ident := pgx.Identifier{schema}.Sanitize()

	// The runner's own bootstrap: the schema and the version table. Under
	// the lock, since concurrent CREATE ... IF NOT EXISTS can still collide.
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, key); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+ident); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+ident+`.tw_schema_migrations (
			version    integer     PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres broker: preparing migrations in schema %s: %w", schema, err)
	}

	for _, m := range all {
		applied := false
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, key); err != nil {
				return err
			}
			var done bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+ident+`.tw_schema_migrations WHERE version = $1)`,
				m.version).Scan(&done); err != nil {
				return err
			}
			if done {
				return nil
			}
			// No arguments: pgx sends it with the simple protocol, which
			// runs a file of several statements.
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+ident+`.tw_schema_migrations (version, applied_at) VALUES ($1, now())`,
				m.version); err != nil {
				return err
			}
			applied = true
			return nil
		})
		if err != nil {
			return fmt.Errorf("postgres broker: migration %s in schema %s: %w", m.name, schema, err)
		}
		if applied {
			log.Info("applied migration", "schema", schema, "migration", m.name)
		}
	}

	var newest int
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+ident+`.tw_schema_migrations`).Scan(&newest); err != nil {
		return fmt.Errorf("postgres broker: reading the migration version: %w", err)
	}
	if known := all[len(all)-1].version; newest > known {
		log.Warn("the database schema is newer than this binary; a newer version migrated it",
			"schema", schema, "database_version", newest, "binary_version", known)
	}
	return nil
}

// init checks the embedded migrations, so a misnamed file fails every
// test and every start rather than one deployment.
func init() {
	all, err := migrations()
	if err != nil {
		panic("broker/postgres: " + err.Error())
	}
	if len(all) == 0 {
		panic("broker/postgres: no migrations embedded")
	}
}
