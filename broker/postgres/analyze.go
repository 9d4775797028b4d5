package postgres

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file owns the statistics keeper: it keeps the planner's statistics
// of tw_messages current when nothing else does, as on a server whose
// autovacuum is off or behind.
//
// The broker's statements run on generic plans made from those statistics
// (connConfig). A table that was never analyzed gives the planner
// defaults that misjudge the queue: a message's unique_key, NULL in nearly
// every row, is taken as NULL in 1 row of 200, so an ack of 50 messages
// is planned as the ack of one, and joins its 50 outcomes to its 50 rows
// in a nested loop that reads the outcomes 50 times. Statistics from any
// ANALYZE of a filled queue describe it at every size after that, since
// the planner scales the rows it counted by the table's pages.
//
// So each broker checks, every analyzeEvery and soon after it submitted
// analyzeKick messages, the table's statistics against the rule of
// PostgreSQL's own autovacuum (analyzeStale), a constant-cost read of the
// statistics functions; when they are stale it runs ANALYZE on a
// connection of its own, once across processes (an advisory lock tried
// without waiting). ANALYZE reads a fixed-size sample of the table, so
// its cost does not grow with the queue, and it blocks no write. Where
// autovacuum keeps up, the rule finds nothing to do.

const (
	// analyzeEvery is how often a broker checks the statistics.
	analyzeEvery = 10 * time.Second
	// analyzeKick: messages submitted through this broker since its last
	// check that make it check again at once.
	analyzeKick = 1000
	// analyzeGap: the least time between two ANALYZEs of a table whose
	// statistics exist, across processes.
	analyzeGap = 10 * time.Second
	// analyzeTimeout bounds a check, and an ANALYZE.
	analyzeTimeout = 2 * time.Minute
)

// tableStats is what a check reads of a table's statistics.
type tableStats struct {
	// tuples is the planner's count of the table's rows (pg_class
	// reltuples): negative when the table was never analyzed (or was
	// truncated since).
	tuples float64
	// modified counts the rows inserted, updated or deleted since the
	// last analyze, as far as the server's statistics have them (each
	// backend reports its own within about a second).
	modified int64
	// since is the time since the last analyze, by anyone; negative when
	// there was none.
	since time.Duration
}

// analyzeStale reports whether statistics s are stale, by autovacuum's
// default rule (autovacuum_analyze_threshold 50 plus
// autovacuum_analyze_scale_factor 0.1 of the rows), counting as modified
// at least the submitted rows this broker knows of; statistics taken less
// than analyzeGap ago are never stale, unless the table has none.
func analyzeStale(s tableStats, submitted int64) bool {
	if s.tuples >= 0 && s.since >= 0 && s.since < analyzeGap {
		return false
	}
	return max(s.modified, submitted) >= 50+int64(0.1*max(s.tuples, 0))
}

// tableStatsSQL reads tableStats of the table $1 (in the schema of the
// search path).
const tableStatsSQL = `SELECT c.reltuples::float8, pg_stat_get_mod_since_analyze(c.oid),
		coalesce(extract(epoch FROM now() - greatest(pg_stat_get_last_analyze_time(c.oid),
			pg_stat_get_last_autoanalyze_time(c.oid)))::float8, -1)
	FROM pg_class c WHERE c.oid = to_regclass($1)`

// analyzeLockSQL tries the advisory lock of the schema's ANALYZE for the
// rest of the transaction.
const analyzeLockSQL = `SELECT pg_try_advisory_xact_lock(hashtextextended('taskhost analyze ' || current_schema(), 0))`

// readTableStats reads the statistics of table through q.
func readTableStats(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table string) (tableStats, error) {
	var s tableStats
	var since float64
	if err := q.QueryRow(ctx, tableStatsSQL, table).Scan(&s.tuples, &s.modified, &since); err != nil {
		return tableStats{}, err
	}
	s.since = time.Duration(since * float64(time.Second))
	return s, nil
}

type statsKeeper struct {
	b         *Broker
	submitted atomic.Int64 // messages submitted since the last check
	kick      chan struct{}
	stop      context.CancelFunc
	ctx       context.Context
	wg        sync.WaitGroup
}

func newStatsKeeper(b *Broker) *statsKeeper {
	ctx, stop := context.WithCancel(context.Background())
	k := &statsKeeper{b: b, kick: make(chan struct{}, 1), ctx: ctx, stop: stop}
	k.wg.Go(k.run)
	return k
}

// wrote notes n messages submitted through the broker.
func (k *statsKeeper) wrote(n int) {
	if k.submitted.Add(int64(n)) >= analyzeKick {
		select {
		case k.kick <- struct{}{}:
		default:
		}
	}
}

// close stops the keeper and waits for it.
func (k *statsKeeper) close() {
	k.stop()
	k.wg.Wait()
}

func (k *statsKeeper) run() {
	t := time.NewTicker(analyzeEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-k.kick:
		case <-k.ctx.Done():
			return
		}
		submitted := k.submitted.Swap(0)
		if err := k.check(submitted); err != nil && k.ctx.Err() == nil {
			k.b.log.Debug("could not check or gather the statistics of tw_messages", "error", err)
		}
	}
}

// check reads the statistics of tw_messages and, when they are stale,
// analyzes it.
func (k *statsKeeper) check(submitted int64) error {
	ctx, cancel := context.WithTimeout(k.ctx, analyzeTimeout)
	defer cancel()
	var s tableStats
	err := k.b.run(ctx, "read table statistics", func(c *pgx.Conn) error {
		var err error
		s, err = readTableStats(ctx, c, "tw_messages")
		return err
	})
	if err != nil || !analyzeStale(s, submitted) {
		return err
	}
	// A connection of its own: ANALYZE of a large table takes a while,
	// and the pool's few connections serve the claims and acks.
	c, err := pgx.ConnectConfig(ctx, k.b.pool.cfg)
	if err != nil {
		return err
	}
	defer closeConn(c)
	analyzed := false
	err = pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, analyzeLockSQL).Scan(&locked); err != nil || !locked {
			return err
		}
		// Another process may have analyzed it since the read above.
		var err error
		if s, err = readTableStats(ctx, tx, "tw_messages"); err != nil || !analyzeStale(s, submitted) {
			return err
		}
		analyzed = true
		_, err = tx.Exec(ctx, `ANALYZE tw_messages`)
		return err
	})
	if err == nil && analyzed {
		k.b.log.Debug("analyzed tw_messages", "rows_before", s.tuples, "modified", max(s.modified, submitted))
	}
	return err
}
