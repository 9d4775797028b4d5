package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/worker"
)

// This file holds the phases that measure several hosts sharing one
// PostgreSQL database, each host played by a broker of its own (its own
// connections and listener) in this process:
//
//   - across hosts (-across-hosts): host A's broker submits the steady
//     stream (-rate for -duration, Submit only: host B's pool is not in
//     A's process, so nothing calls its Wake), and host B's pool runs it;
//     latency from just before Submit to B's report of the message done.
//     Once with the pool waiting for announcements (LISTEN/NOTIFY, the
//     default) and once polling every worker.DefaultClaimIdleInterval, as
//     before announcements (the pool's broker hides broker.Notifier).
//   - idle pools (-idle-pools N): N brokers, each with a pool and nothing
//     to run, for -idle-for; the transactions the database committed per
//     second over that window (pg_stat_database, xact_commit and
//     xact_rollback of the bench's database: give -dsn a database nobody
//     else uses), polling and then listening.

// pollMode says how the pools of a phase wait for work.
type pollMode string

const (
	modeListen pollMode = "listen" // announcements, ClaimIdleFallback between polls
	modePoll   pollMode = "poll"   // ClaimIdleInterval between polls
)

// pool returns a pool of reg on b that waits for work as m says: in
// modePoll b is hidden behind a broker without announcements, as before
// brokers had them (the pool polls every ClaimIdleInterval, and nothing
// but its own Wake cuts that short).
func (m pollMode) pool(b *postgres.Broker, reg *worker.Registry, o worker.Options) *worker.Pool {
	if m == modePoll {
		return worker.NewPool(unannounced{b, b, b}, reg, o)
	}
	return worker.NewPool(b, reg, o)
}

// unannounced is a PostgreSQL broker without broker.Notifier.
type unannounced struct {
	broker.Broker
	broker.AckClaimer
	broker.OrphanReclaimer
}

// host opens another broker on the bench's schema, as another host's.
func (bn *bench) host(ctx context.Context) (*postgres.Broker, error) {
	return postgres.New(ctx, postgres.Options{DSN: bn.cfg.dsn, Schema: bn.schema, Logger: bn.log.Named("postgres")})
}

// waitListening waits until b's listening connection is up.
func waitListening(ctx context.Context, b *postgres.Broker) error {
	s := b.Subscribe()
	defer s.Close()
	deadline := time.Now().Add(30 * time.Second)
	for !s.Listening() {
		if time.Now().After(deadline) {
			return fmt.Errorf("broker of schema %s is not listening after 30s", b.Schema())
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// acrossHosts runs the across-hosts phase once in mode.
func (bn *bench) acrossHosts(ctx context.Context, run int, mode pollMode) (benchResult, error) {
	cfg := bn.cfg
	r := benchResult{Run: run, SteadyN: max(1, int(math.Round(cfg.rate*cfg.duration.Seconds())))}
	if err := bn.reset(ctx); err != nil {
		return r, err
	}
	topic := bn.topic("hosts-"+string(mode), run)
	if err := bn.setLimit(ctx, topic); err != nil {
		return r, err
	}
	hb, err := bn.host(ctx)
	if err != nil {
		return r, err
	}
	defer hb.Close()
	obs := newBenchObserver(r.SteadyN, true)
	reg := worker.NewRegistry()
	reg.MustRegister(worker.Task{Name: benchTask, Topic: topic,
		Handler: func(context.Context, *worker.TaskContext) (any, error) { return nil, nil }})
	p := mode.pool(hb, reg, worker.Options{Concurrency: cfg.workers, Observer: obs, Logger: bn.log.Named("pool")})
	if err := p.Start(ctx); err != nil {
		return r, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = p.Stop(sctx)
	}()
	if mode == modeListen {
		if err := waitListening(ctx, hb); err != nil {
			return r, err
		}
	}
	// Let the pool open its connections and reach its idle wait.
	time.Sleep(500 * time.Millisecond)
	if err := bn.stream(ctx, topic, &r, obs, nil); err != nil {
		return r, err
	}
	return r, nil
}

// idleRate runs n idle pools, each on a broker of its own, for
// cfg.idleFor, and returns the transactions per second the database
// committed (or rolled back) meanwhile.
func (bn *bench) idleRate(ctx context.Context, n int, mode pollMode, run int) (float64, error) {
	topic := bn.topic("idle-"+string(mode), run)
	var (
		brokers []*postgres.Broker
		pools   []*worker.Pool
	)
	defer func() {
		for _, p := range pools {
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_ = p.Stop(sctx)
			cancel()
		}
		for _, b := range brokers {
			_ = b.Close()
		}
	}()
	for range n {
		b, err := bn.host(ctx)
		if err != nil {
			return 0, err
		}
		brokers = append(brokers, b)
		reg := worker.NewRegistry()
		reg.MustRegister(worker.Task{Name: benchTask, Topic: topic,
			Handler: func(context.Context, *worker.TaskContext) (any, error) { return nil, nil }})
		p := mode.pool(b, reg, worker.Options{Logger: bn.log.Named("pool")})
		if err := p.Start(ctx); err != nil {
			return 0, err
		}
		pools = append(pools, p)
	}
	for _, b := range brokers {
		if mode != modeListen {
			break
		}
		if err := waitListening(ctx, b); err != nil {
			return 0, err
		}
	}
	time.Sleep(2 * time.Second) // past the start-up claims
	xacts := func() (int64, error) {
		var v int64
		_, _ = bn.admin.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
		err := bn.admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&v)
		return v, err
	}
	// PostgreSQL publishes a backend's counts when it goes idle, at most
	// once a second: both reads are taken the same way.
	before, err := xacts()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	select {
	case <-time.After(bn.cfg.idleFor):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	time.Sleep(statsPublished) // let the last counts be published
	after, err := xacts()
	if err != nil {
		return 0, err
	}
	secs := time.Since(start).Seconds()
	return float64(after-before-2) / secs, nil // less the bench's own two reads
}

// runHosts runs the phases of this file that cfg asks for, -runs times
// each, printing every run and the medians.
func runHosts(ctx context.Context, bn *bench, out io.Writer, summary map[string]any) error {
	cfg := bn.cfg
	if cfg.acrossHosts {
		fmt.Fprintf(out, "== across hosts: host A submits %g/s for %s (Submit, no Wake); host B's pool (a broker of its own, Concurrency %d) runs them\n",
			cfg.rate, cfg.duration, cfg.workers)
		// The modes take turns run by run, so both see the same machine.
		modes := []pollMode{modeListen, modePoll}
		p50, p99, mx := map[pollMode][]float64{}, map[pollMode][]float64{}, map[pollMode][]float64{}
		for run := 1; run <= cfg.runs; run++ {
			for _, mode := range modes {
				r, err := bn.acrossHosts(ctx, run, mode)
				if err != nil {
					return fmt.Errorf("across hosts (%s), run %d: %w", mode, run, err)
				}
				fmt.Fprintf(out, "  %-6s run %d  %6d jobs at %6.0f/s  latency p50 %s  p95 %s  p99 %s  max %s ms\n",
					mode, run, r.SteadyN, r.SteadyRate, fmtNum(r.SteadyP50), fmtNum(r.SteadyP95), fmtNum(r.SteadyP99), fmtNum(r.SteadyMax))
				p50[mode], p99[mode], mx[mode] = append(p50[mode], r.SteadyP50), append(p99[mode], r.SteadyP99), append(mx[mode], r.SteadyMax)
			}
		}
		for _, mode := range modes {
			fmt.Fprintf(out, "  %-6s median of %d runs: p50 %s ms  p99 %s ms  (max %s ms)\n",
				mode, cfg.runs, fmtNum(median(p50[mode])), fmtNum(median(p99[mode])), fmtNum(median(mx[mode])))
			summary["hosts_"+string(mode)+"_p50_ms"] = round2(median(p50[mode]))
			summary["hosts_"+string(mode)+"_p99_ms"] = round2(median(p99[mode]))
		}
	}
	if cfg.idlePools > 0 {
		fmt.Fprintf(out, "== idle pools: %d brokers (own connections each) with one idle pool each, %s; transactions/s of database %s\n",
			cfg.idlePools, cfg.idleFor, redactedDSN(cfg.dsn))
		for _, mode := range []pollMode{modePoll, modeListen} {
			var v []float64
			var each []string
			for run := 1; run <= cfg.runs; run++ {
				q, err := bn.idleRate(ctx, cfg.idlePools, mode, run)
				if err != nil {
					return fmt.Errorf("idle pools (%s), run %d: %w", mode, run, err)
				}
				v = append(v, q)
				each = append(each, fmtNum(q))
			}
			fmt.Fprintf(out, "  %-6s median %s transactions/s  (runs: %s)\n", mode, fmtNum(median(v)), strings.Join(each, ", "))
			summary["idle_"+string(mode)+"_xact_per_s"] = round2(median(v))
		}
	}
	return nil
}

var _ broker.Notifier = (*postgres.Broker)(nil)
