package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// A lease is what one claim took: its messages, run by the workers one by
// one, then acked whole by one of the ack writers.
type lease interface {
	size() int
	run(i int) // a worker runs message i: a no-op task
	ack(ctx context.Context, conn *pgx.Conn) error
}

// claimFunc leases up to want messages on conn, in the transaction that
// takes the topic's row; nil when none are available.
type claimFunc func(ctx context.Context, conn *pgx.Conn, want int) (lease, error)

// burnDown runs the pool: one claimer on conns[0], workers workers, and an
// ack writer on each other connection, until n messages are acked. A claim
// asks for the free workers' worth, at most maxClaim; after an empty one
// the claimer waits for an ack or 2 ms.
func burnDown(ctx context.Context, conns []*pgx.Conn, n, workers, maxClaim int, claim claimFunc) (elapsed time.Duration, claims, ackWrites int64, err error) {
	type job struct {
		l    lease
		i    int
		left *atomic.Int64
	}
	type finishedLease struct {
		l lease
		n int
	}
	jobs := make(chan job, workers)
	finished := make(chan finishedLease, workers)
	wake := make(chan struct{}, 1)
	var acked, nClaims, nAcks, inflight atomic.Int64
	done := make(chan struct{})
	var doneOnce sync.Once
	errc := make(chan error, len(conns))

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range jobs {
				inflight.Add(-1)
				j.l.run(j.i)
				if j.left.Add(-1) == 0 {
					finished <- finishedLease{j.l, j.l.size()}
				}
			}
		})
	}
	var writing sync.WaitGroup
	for _, conn := range conns[1:] {
		writing.Go(func() {
			for f := range finished {
				if err := f.l.ack(ctx, conn); err != nil {
					errc <- fmt.Errorf("ack: %w", err)
					return
				}
				nAcks.Add(1)
				if acked.Add(int64(f.n)) >= int64(n) {
					doneOnce.Do(func() { close(done) })
				}
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		})
	}

	start := time.Now()
	claimErr := make(chan error, 1)
	go func() {
		defer close(jobs)
		for {
			select {
			case <-done:
				claimErr <- nil
				return
			default:
			}
			var l lease
			if want := min(maxClaim, workers-int(inflight.Load())); want > 0 {
				var err error
				if l, err = claim(ctx, conns[0], want); err != nil {
					claimErr <- fmt.Errorf("claim: %w", err)
					return
				}
				nClaims.Add(1)
			}
			if l == nil {
				select {
				case <-wake:
				case <-time.After(2 * time.Millisecond):
				case <-done:
				}
				continue
			}
			left := new(atomic.Int64)
			left.Store(int64(l.size()))
			inflight.Add(int64(l.size()))
			for i := range l.size() {
				jobs <- job{l, i, left}
			}
		}
	}()

	select {
	case <-done:
	case err := <-errc:
		return 0, 0, 0, err
	case err := <-claimErr:
		if err != nil {
			return 0, 0, 0, err
		}
	}
	elapsed = time.Since(start)
	if err := <-claimErr; err != nil {
		return 0, 0, 0, err
	}
	wg.Wait()
	close(finished)
	writing.Wait()
	return elapsed, nClaims.Load(), nAcks.Load(), nil
}

// connect opens n connections with the runtime parameters params.
func connect(ctx context.Context, dsn string, n int, params map[string]string) ([]*pgx.Conn, error) {
	conns := make([]*pgx.Conn, 0, n)
	for range n {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			closeAll(conns)
			return nil, err
		}
		for k, v := range params {
			cfg.RuntimeParams[k] = v
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			closeAll(conns)
			return nil, err
		}
		conns = append(conns, conn)
	}
	return conns, nil
}

func closeAll(conns []*pgx.Conn) {
	for _, c := range conns {
		c.Close(context.Background())
	}
}

// dropOnExit drops schema through admin, saying so if it cannot.
func dropOnExit(admin *pgx.Conn, schema string) {
	if _, err := admin.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`); err != nil {
		fmt.Fprintln(os.Stderr, "pipeline: dropping the schema:", err)
	}
}

// lockAndClaim runs lockSQL (which takes the topic's row) and then the
// claim statement sql in one implicit transaction, calling scan for each
// row the claim returns.
func lockAndClaim(ctx context.Context, conn *pgx.Conn, lockSQL, sql string, args []any, scan func(pgx.Rows) error) error {
	b := &pgx.Batch{}
	b.Queue(lockSQL)
	b.Queue(sql, args...)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return err
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
