package local

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

// migrations holds the schema, one numbered file per version:
// NNNN_name.sql. A file is never edited once released; a change is a new
// file.
//
//go:embed migrations/*.sql
var migrations embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// loadMigrations returns the embedded migrations by version.
func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrations, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name is not NNNN_name.sql", name)
		}
		body, err := fs.ReadFile(migrations, path.Join("migrations", name))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: name, sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	// Versions ascend; gaps are allowed (numbers are reserved by the
	// changes that bring them, which may land in any order).
	for i := 1; i < len(out); i++ {
		if out[i].version == out[i-1].version {
			return nil, fmt.Errorf("migrations %s and %s share version %d", out[i-1].name, out[i].name, out[i].version)
		}
	}
	return out, nil
}

// migrate brings the schema up to date. Each step is its own IMMEDIATE
// transaction that first checks whether another process applied it
// meanwhile, so several processes opening a new file at once are safe: one
// applies a version, the others wait for its lock and then skip it.
func (b *Broker) migrate(ctx context.Context) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	err = b.migrateTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS tw_schema_migrations (
			version    INTEGER NOT NULL PRIMARY KEY,
			name       TEXT    NOT NULL,
			applied_at INTEGER NOT NULL
		)`)
		if err != nil {
			return err
		}
		var newest int
		if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM tw_schema_migrations`).Scan(&newest); err != nil {
			return err
		}
		if known := ms[len(ms)-1].version; newest > known {
			return fmt.Errorf("database schema version %d is newer than this program knows (%d); use a newer taskhost", newest, known)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	for _, m := range ms {
		applied := false
		err := b.migrateTx(ctx, func(tx *sql.Tx) error {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM tw_schema_migrations WHERE version = ?`, m.version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO tw_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
				m.version, m.name, ns(time.Now()))
			applied = err == nil
			return err
		})
		if err != nil {
			return fmt.Errorf("migration %s: %w", m.name, err)
		}
		if applied {
			b.log.Info("applied schema migration", "path", b.path, "version", m.version, "name", m.name)
		}
	}
	return nil
}

// migrateTx runs fn in an IMMEDIATE transaction on the writer. Opening the
// first connection also switches a new file to WAL, which takes a lock of
// its own; should that (or BEGIN) still find the file busy after
// busyTimeout, it is tried again a few times before giving up.
func (b *Broker) migrateTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var tx *sql.Tx
		tx, err = b.writer.BeginTx(ctx, nil)
		if err == nil {
			if err = fn(tx); err == nil {
				err = tx.Commit()
			} else {
				_ = tx.Rollback()
			}
		}
		if err == nil || !isBusy(err) || ctx.Err() != nil {
			return err
		}
		b.log.Warn("database busy while migrating, trying again", "path", b.path, "error", err)
	}
	return err
}
