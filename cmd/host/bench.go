package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/plugins/tasksworker"
	"github.com/taskhost/taskhost/worker"
)

// The bench command measures the broker and the worker pool as they ship:
// the real worker.Pool with its default options (only Concurrency is set)
// running a no-op task from a worker.Registry, against a broker opened
// with its default options. Each run has three phases, and -runs repeats
// them; every run is printed and so is the median:
//
//   - bulk submit: -jobs messages queued, through broker.BatchSubmitter
//     when the broker has it (batches of -submit-batch), else Submit, from
//     -submitters goroutines;
//   - burn-down: from just before Pool.Start until the observer has seen
//     all -jobs of them done (the pool reports an attempt after its outcome
//     is written: for a done message, after the Ack committed), one topic
//     with concurrency limit -limit, -workers handlers;
//   - steady stream: -rate submits a second for -duration on a fresh
//     topic, one Submit per message from an open-loop schedule (each call
//     starts at its planned time in a goroutine of its own, at most 64 in
//     flight), followed by Pool.Wake as the tasks_worker plugin's submit
//     API does. End-to-end latency runs from just before Submit is called
//     to the moment the pool reports the message done, which is after the
//     Ack that marks it done returned (committed).
//
// With -claim-latency (postgres only) it then seeds 1,000 and 1,000,000
// queued messages in turn and times Claim of one message, nacking each
// claimed message back outside the timer so the depth stays put.

// benchTask is the no-op task the pools run.
const benchTask = "bench.noop"

type benchConfig struct {
	kind         string
	dsn          string
	schema       string
	dataDir      string
	keep         bool
	jobs         int
	workers      int
	limit        int
	rate         float64
	duration     time.Duration
	runs         int
	claimLatency bool
	claimSamples int
	reports      bool
	submitters   int
	submitBatch  int
	timeout      time.Duration
	verbose      bool
	cpuProfile   string
}

func benchDefaultDSN() string {
	for _, env := range []string{tasksworker.DSNEnv, "TEST_DATABASE_URL"} {
		if v := os.Getenv(env); v != "" {
			return v
		}
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

func benchCmd(args []string) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var c benchConfig
	fs.StringVar(&c.kind, "broker", "postgres", "broker to measure: memory, local or postgres")
	fs.StringVar(&c.dsn, "dsn", benchDefaultDSN(), "PostgreSQL address (default $"+tasksworker.DSNEnv+", then $TEST_DATABASE_URL)")
	fs.StringVar(&c.schema, "schema", "", "PostgreSQL schema for the bench's tables (default a fresh tw_bench_<random>); it is dropped at the end unless -keep")
	fs.StringVar(&c.dataDir, "data-dir", "", "directory for the local broker's database file (default a temporary directory)")
	fs.BoolVar(&c.keep, "keep", false, "keep the schema (postgres) or the database file (local) at the end")
	fs.IntVar(&c.jobs, "jobs", 50000, "messages per bulk submit and burn-down")
	fs.IntVar(&c.workers, "workers", 100, "worker pool concurrency (handlers)")
	fs.IntVar(&c.limit, "limit", -1, "the topics' concurrency limit (default -workers; 0 is unlimited)")
	fs.Float64Var(&c.rate, "rate", 500, "steady stream: submits per second")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "steady stream: how long it submits")
	fs.IntVar(&c.runs, "runs", 3, "repetitions of each phase (every run is printed, and the median)")
	fs.BoolVar(&c.claimLatency, "claim-latency", false, "postgres: also time Claim with 1,000 and 1,000,000 queued messages (seeding takes about 20 s)")
	fs.IntVar(&c.claimSamples, "claim-samples", 1000, "claims timed per run of the claim-latency phase")
	fs.IntVar(&c.submitters, "submitters", 8, "goroutines submitting in the bulk submit phase")
	fs.BoolVar(&c.reports, "reports", false, "store a task report per attempt, as the tasks_worker plugin does (worker.ReportWriter); the burn-down then ends when the last report is stored")
	fs.IntVar(&c.submitBatch, "submit-batch", 1000, "messages per SubmitMany call when the broker has one (0 or 1: Submit one by one)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "give up on a phase after this long")
	fs.BoolVar(&c.verbose, "v", false, "log the pool's and broker's warnings to stderr")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the bench process to this file")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: host bench [flags]\n\nMeasures the broker and the worker pool with their default settings.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if c.limit < 0 {
		c.limit = c.workers
	}
	switch {
	case c.kind != "memory" && c.kind != "local" && c.kind != "postgres":
		fmt.Fprintf(os.Stderr, "host bench: unknown broker %q; use memory, local or postgres\n", c.kind)
		return 2
	case c.jobs < 1 || c.workers < 1 || c.runs < 1 || c.rate <= 0 || c.duration <= 0 || c.submitters < 1 || c.claimSamples < 1:
		fmt.Fprintln(os.Stderr, "host bench: -jobs, -workers, -runs, -rate, -duration, -submitters and -claim-samples must be positive")
		return 2
	case c.submitBatch < 0 || c.submitBatch > broker.MaxSubmitBatch:
		fmt.Fprintf(os.Stderr, "host bench: -submit-batch must be from 0 to %d\n", broker.MaxSubmitBatch)
		return 2
	case c.claimLatency && c.kind != "postgres":
		fmt.Fprintln(os.Stderr, "host bench: -claim-latency needs -broker postgres")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "host bench: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "host bench: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	if err := runBench(ctx, c, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "host bench: %v\n", err)
		return 1
	}
	return 0
}

// bench is one bench session: the broker under test and, for postgres, a
// connection of its own for resets and seeding.
type bench struct {
	cfg    benchConfig
	out    io.Writer
	log    hclog.Logger
	b      broker.Broker
	admin  *pgx.Conn // postgres only; search_path is the bench schema
	schema string
	runTag string          // keeps topic names unique across sessions sharing a -schema
	calls  *countingBroker // the last pool's broker calls

	reports *worker.ReportWriter // the last pool's, with -reports
	dropped atomic.Int64         // reports it did not store
}

// benchResult is one run of the three main phases.
type benchResult struct {
	Run          int     `json:"run"`
	SubmitPerSec float64 `json:"submit_jobs_per_s"`
	BurnPerSec   float64 `json:"burn_jobs_per_s"`
	BurnSecs     float64 `json:"burn_s"`
	SteadyN      int     `json:"steady_n"`
	SteadyRate   float64 `json:"steady_achieved_rate"`
	SteadyP50    float64 `json:"steady_p50_ms"`
	SteadyP95    float64 `json:"steady_p95_ms"`
	SteadyP99    float64 `json:"steady_p99_ms"`
	SteadyMax    float64 `json:"steady_max_ms"`
	SubmitP50    float64 `json:"steady_submit_p50_ms"`
	SubmitP99    float64 `json:"steady_submit_p99_ms"`
}

// claimResult is one run of the claim-latency phase at one depth.
type claimResult struct {
	Depth int     `json:"depth"`
	Run   int     `json:"run"`
	P50   float64 `json:"p50_ms"`
	P95   float64 `json:"p95_ms"`
	P99   float64 `json:"p99_ms"`
	Mean  float64 `json:"mean_ms"`
}

// gcNote describes the garbage collector target gc (as worker.TuneGC
// returns it).
func gcNote(gc int) string {
	switch {
	case gc < 0:
		return "off (from the environment)"
	case gc == worker.GCPercent && os.Getenv("GOGC") == "":
		return fmt.Sprintf("%d (the worker process's default, as in the tasks_worker plugin; GOGC overrides)", gc)
	default:
		return fmt.Sprintf("%d (from the environment)", gc)
	}
}

func runBench(ctx context.Context, cfg benchConfig, out io.Writer) (err error) {
	bn := &bench{cfg: cfg, out: out, log: hclog.NewNullLogger(), runTag: randomHex(3)}
	if cfg.verbose {
		bn.log = hclog.New(&hclog.LoggerOptions{Name: "bench", Level: hclog.Warn, Output: os.Stderr})
	}
	summary := map[string]any{"broker": cfg.kind}
	// The pool runs in this process: give it the garbage collector target
	// the tasks_worker plugin process runs with.
	gc := worker.TuneGC()

	fmt.Fprintln(out, "== machine")
	mach := machineFacts()
	for _, k := range []string{"cpu", "cores", "memory", "go", "os"} {
		fmt.Fprintf(out, "  %-8s %s\n", k+":", mach[k])
	}
	summary["machine"] = mach

	cleanup, err := bn.open(ctx)
	if cleanup != nil {
		defer cleanup()
	}
	if err != nil {
		return err
	}
	if bn.admin != nil {
		pg, err := postgresFacts(ctx, bn.admin)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, "== postgresql")
		fmt.Fprintf(out, "  %s\n", pg["version"])
		for _, k := range pgSettings {
			fmt.Fprintf(out, "  %-20s %s\n", k, pg[k])
		}
		summary["postgres"] = pg
	}

	params := map[string]any{
		"broker": cfg.kind, "jobs": cfg.jobs, "workers": cfg.workers, "limit": cfg.limit,
		"rate": cfg.rate, "duration_s": cfg.duration.Seconds(), "runs": cfg.runs,
		"claim_latency": cfg.claimLatency, "submitters": cfg.submitters, "submit_batch": cfg.submitBatch,
		"reports": cfg.reports,
		"gogc":    gc,
	}
	_, batched := bn.b.(broker.BatchSubmitter)
	submitVia := "Submit"
	if batched && cfg.submitBatch > 1 {
		submitVia = fmt.Sprintf("SubmitMany, %d per call", cfg.submitBatch)
	}
	fmt.Fprintln(out, "== parameters")
	fmt.Fprintf(out, "  broker %s", cfg.kind)
	switch cfg.kind {
	case "postgres":
		fmt.Fprintf(out, " (%s, schema %s, default options)", redactedDSN(cfg.dsn), bn.schema)
	case "local":
		fmt.Fprintf(out, " (%s, default options)", bn.schema)
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "  pool: worker.Pool, default options but Concurrency %d; a no-op task; topic concurrency limit %d\n", cfg.workers, cfg.limit)
	if cfg.reports {
		fmt.Fprintln(out, "  task reports: one per attempt, stored by worker.ReportWriter (as the tasks_worker plugin does)")
	} else {
		fmt.Fprintln(out, "  task reports: none (-reports stores them as the tasks_worker plugin does)")
	}
	fmt.Fprintf(out, "  go gc: GOGC %s\n", gcNote(gc))
	fmt.Fprintf(out, "  bulk submit: %d messages via %s, %d goroutines\n", cfg.jobs, submitVia, cfg.submitters)
	fmt.Fprintf(out, "  burn-down: %d no-op tasks; steady: %g/s for %s (Submit then Pool.Wake, as the submit API does)\n", cfg.jobs, cfg.rate, cfg.duration)
	fmt.Fprintf(out, "  runs: %d", cfg.runs)
	if cfg.claimLatency {
		fmt.Fprintf(out, "; claim latency: %d claims of 1 per run at 1,000 and 1,000,000 queued", cfg.claimSamples)
	}
	fmt.Fprintln(out)
	summary["params"] = params

	var results []benchResult
	for run := 1; run <= cfg.runs; run++ {
		fmt.Fprintf(out, "== run %d/%d\n", run, cfg.runs)
		r, err := bn.run(ctx, run)
		if err != nil {
			return fmt.Errorf("run %d: %w", run, err)
		}
		results = append(results, r)
	}

	var claims []claimResult
	if cfg.claimLatency {
		fmt.Fprintln(out, "== claim latency (Claim of 1 message, topic limit applied; the depths take turns claim by claim)")
		var err error
		if claims, err = bn.claimLatency(ctx); err != nil {
			return fmt.Errorf("claim latency: %w", err)
		}
	}

	// Medians.
	med := func(f func(benchResult) float64) float64 {
		v := make([]float64, len(results))
		for i, r := range results {
			v[i] = f(r)
		}
		return median(v)
	}
	fmt.Fprintf(out, "== medians of %d runs\n", len(results))
	rows := []struct {
		name, key string
		f         func(benchResult) float64
		unit      string
	}{
		{"bulk submit", "submit_jobs_per_s", func(r benchResult) float64 { return r.SubmitPerSec }, "jobs/s"},
		{"burn-down", "burn_jobs_per_s", func(r benchResult) float64 { return r.BurnPerSec }, "jobs/s"},
		{"steady p50", "steady_p50_ms", func(r benchResult) float64 { return r.SteadyP50 }, "ms"},
		{"steady p95", "steady_p95_ms", func(r benchResult) float64 { return r.SteadyP95 }, "ms"},
		{"steady p99", "steady_p99_ms", func(r benchResult) float64 { return r.SteadyP99 }, "ms"},
		{"steady submit p50", "steady_submit_p50_ms", func(r benchResult) float64 { return r.SubmitP50 }, "ms"},
		{"steady achieved rate", "steady_achieved_rate", func(r benchResult) float64 { return r.SteadyRate }, "/s"},
	}
	for _, row := range rows {
		m := med(row.f)
		var each []string
		for _, r := range results {
			each = append(each, fmtNum(row.f(r)))
		}
		fmt.Fprintf(out, "  %-22s %10s %-6s (runs: %s)\n", row.name, fmtNum(m), row.unit, strings.Join(each, ", "))
		summary[row.key] = round2(m)
	}
	if len(claims) > 0 {
		p50 := map[int]float64{}
		for _, depth := range []int{1_000, 1_000_000} {
			var v, v99 []float64
			for _, c := range claims {
				if c.Depth == depth {
					v = append(v, c.P50)
					v99 = append(v99, c.P99)
				}
			}
			p50[depth] = median(v)
			key := "claim_1k"
			if depth == 1_000_000 {
				key = "claim_1m"
			}
			summary[key+"_p50_ms"] = round3(median(v))
			summary[key+"_p99_ms"] = round3(median(v99))
			fmt.Fprintf(out, "  %-22s %10s ms     (p99 %s ms)\n", fmt.Sprintf("claim p50 @ %d", depth), fmtNum(median(v)), fmtNum(median(v99)))
		}
		ratio := p50[1_000_000] / p50[1_000]
		summary["claim_ratio_1m_1k"] = round2(ratio)
		fmt.Fprintf(out, "  %-22s %10.2f x\n", "claim p50 1M / 1k", ratio)
		summary["claim_runs"] = claims
	}
	summary["runs"] = results
	line, err := json.Marshal(summary)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "== summary (JSON)")
	fmt.Fprintln(out, string(line))
	return nil
}

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

// run runs the three main phases once.
func (bn *bench) run(ctx context.Context, run int) (benchResult, error) {
	cfg := bn.cfg
	r := benchResult{Run: run}
	if err := bn.reset(ctx); err != nil {
		return r, err
	}

	// Bulk submit.
	topic := bn.topic("burn", run)
	if err := bn.setLimit(ctx, topic); err != nil {
		return r, err
	}
	d, err := bn.bulkSubmit(ctx, topic, cfg.jobs)
	if err != nil {
		return r, fmt.Errorf("bulk submit: %w", err)
	}
	r.SubmitPerSec = float64(cfg.jobs) / d.Seconds()
	fmt.Fprintf(bn.out, "  bulk submit   %8d jobs in %7.3fs  %10s jobs/s\n", cfg.jobs, d.Seconds(), fmtNum(r.SubmitPerSec))
	if err := bn.settle(ctx); err != nil {
		return r, err
	}

	// Burn-down.
	d, err = bn.burnDown(ctx, topic, cfg.jobs)
	if err != nil {
		return r, fmt.Errorf("burn-down: %w", err)
	}
	r.BurnSecs = d.Seconds()
	r.BurnPerSec = float64(cfg.jobs) / d.Seconds()
	fmt.Fprintf(bn.out, "  burn-down     %8d jobs in %7.3fs  %10s jobs/s  (%s)\n", cfg.jobs, d.Seconds(), fmtNum(r.BurnPerSec), bn.calls)

	// Steady stream.
	if err := bn.reset(ctx); err != nil {
		return r, err
	}
	if err := bn.steady(ctx, bn.topic("steady", run), &r); err != nil {
		return r, fmt.Errorf("steady: %w", err)
	}
	fmt.Fprintf(bn.out, "  steady        %8d jobs at %6.0f/s  latency p50 %s  p95 %s  p99 %s  max %s ms  (Submit p50 %s  p99 %s ms)\n",
		r.SteadyN, r.SteadyRate, fmtNum(r.SteadyP50), fmtNum(r.SteadyP95), fmtNum(r.SteadyP99), fmtNum(r.SteadyMax),
		fmtNum(r.SubmitP50), fmtNum(r.SubmitP99))
	return r, nil
}

func benchPayload(i int) json.RawMessage {
	return json.RawMessage(`{"seq":` + strconv.Itoa(i) + `}`)
}

// bulkSubmit queues n messages of the no-op task on topic and returns how
// long it took.
func (bn *bench) bulkSubmit(ctx context.Context, topic string, n int) (time.Duration, error) {
	cfg := bn.cfg
	bs, batched := bn.b.(broker.BatchSubmitter)
	batch := 1
	if batched && cfg.submitBatch > 1 {
		batch = cfg.submitBatch
	}
	var (
		next     atomic.Int64 // the next message index to hand out
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	for range cfg.submitters {
		wg.Go(func() {
			reqs := make([]broker.SubmitRequest, 0, batch)
			for {
				from := int(next.Add(int64(batch))) - batch
				if from >= n || ctx.Err() != nil {
					return
				}
				to := min(from+batch, n)
				var err error
				if batch == 1 {
					_, err = bn.b.Submit(ctx, broker.SubmitRequest{Topic: topic, Task: benchTask, Payload: benchPayload(from)})
				} else {
					reqs = reqs[:0]
					for i := from; i < to; i++ {
						reqs = append(reqs, broker.SubmitRequest{Topic: topic, Task: benchTask, Payload: benchPayload(i)})
					}
					_, err = bs.SubmitMany(ctx, reqs)
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// benchObserver counts finished attempts and records when each message
// finished. It implements worker.Observer and worker.MessageObserver.
type benchObserver struct {
	want     int64
	finished atomic.Int64
	notDone  atomic.Int64
	all      chan struct{}
	once     sync.Once

	record bool
	mu     sync.Mutex
	at     map[int64]time.Time
}

func newBenchObserver(want int, record bool) *benchObserver {
	o := &benchObserver{want: int64(want), all: make(chan struct{}), record: record}
	if record {
		o.at = make(map[int64]time.Time, want)
	}
	return o
}

func (o *benchObserver) TaskStarted(string) {}

func (o *benchObserver) TaskFinished(string, string, string, time.Duration) {}

func (o *benchObserver) MessageFinished(id int64, _, _, status string) {
	now := time.Now()
	if status != worker.StatusDone {
		o.notDone.Add(1)
	}
	if o.record {
		o.mu.Lock()
		o.at[id] = now
		o.mu.Unlock()
	}
	if o.finished.Add(1) == o.want {
		o.once.Do(func() { close(o.all) })
	}
}

// countingBroker counts the pool's Claim and Ack calls and what they
// carried, for the phase reports.
type countingBroker struct {
	broker.Broker
	claims, claimed, acks, acked atomic.Int64
	claimNanos                   atomic.Int64 // time spent in claim calls
}

func (c *countingBroker) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	start := time.Now()
	msgs, err := c.Broker.Claim(ctx, req)
	c.claimNanos.Add(int64(time.Since(start)))
	c.claims.Add(1)
	c.claimed.Add(int64(len(msgs)))
	return msgs, err
}

func (c *countingBroker) Ack(ctx context.Context, outcomes []broker.Outcome) ([]error, error) {
	c.acks.Add(1)
	c.acked.Add(int64(len(outcomes)))
	return c.Broker.Ack(ctx, outcomes)
}

// countingAckClaimer is a countingBroker over a broker.AckClaimer, so
// the pool still finds the interface.
type countingAckClaimer struct {
	*countingBroker
	ac broker.AckClaimer
}

func (c countingAckClaimer) AckAndClaim(ctx context.Context, outcomes []broker.Outcome, req broker.ClaimRequest) ([]error, []broker.Message, error) {
	start := time.Now()
	errs, msgs, err := c.ac.AckAndClaim(ctx, outcomes, req)
	c.claimNanos.Add(int64(time.Since(start)))
	c.claims.Add(1)
	c.claimed.Add(int64(len(msgs)))
	if len(outcomes) > 0 {
		c.acks.Add(1)
		c.acked.Add(int64(len(outcomes)))
	}
	return errs, msgs, err
}

func (c *countingBroker) String() string {
	per := func(n, calls int64) float64 {
		if calls == 0 {
			return 0
		}
		return float64(n) / float64(calls)
	}
	return fmt.Sprintf("%d claims (%.1f messages, %.2f ms each), %d ack writes (%.1f each)",
		c.claims.Load(), per(c.claimed.Load(), c.claims.Load()), per(c.claimNanos.Load(), c.claims.Load())/1e6,
		c.acks.Load(), per(c.acked.Load(), c.acks.Load()))
}

func (bn *bench) newPool(topic string, obs worker.Observer) *worker.Pool {
	reg := worker.NewRegistry()
	reg.MustRegister(worker.Task{
		Name:    benchTask,
		Topic:   topic,
		Handler: func(context.Context, *worker.TaskContext) (any, error) { return nil, nil },
	})
	bn.calls = &countingBroker{Broker: bn.b}
	var b broker.Broker = bn.calls
	if ac, ok := bn.b.(broker.AckClaimer); ok {
		b = countingAckClaimer{countingBroker: bn.calls, ac: ac}
	}
	opts := worker.Options{
		Concurrency: bn.cfg.workers,
		Observer:    obs,
		Logger:      bn.log.Named("pool"),
	}
	bn.reports = nil
	bn.dropped.Store(0)
	if bn.cfg.reports {
		bn.reports = worker.NewReportWriter(bn.b, bn.log.Named("reports"), func(n int) { bn.dropped.Add(int64(n)) })
		opts.Reporter = bn.reports
	}
	return worker.NewPool(b, reg, opts)
}

// stopPool stops p and then the report writer, if any, once it stored
// what it holds; reports it dropped are an error.
func (bn *bench) stopPool(p *worker.Pool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := p.Stop(ctx)
	if bn.reports != nil {
		bn.reports.Close(context.Background())
		bn.reports = nil
		if d := bn.dropped.Load(); d > 0 && err == nil {
			err = fmt.Errorf("%d task reports were not stored", d)
		}
	}
	return err
}

// checkEmpty verifies that topic has nothing queued or running left.
func (bn *bench) checkEmpty(ctx context.Context, topic string) error {
	st, err := bn.b.Stats(ctx)
	if err != nil {
		return err
	}
	for _, ts := range st.Topics {
		if ts.Name == topic && (ts.Queued != 0 || ts.Running != 0) {
			return fmt.Errorf("topic %s still has %d queued and %d running after the phase", topic, ts.Queued, ts.Running)
		}
	}
	return nil
}

// burnDown starts a pool on topic, which holds n queued messages, and
// returns the time from just before Pool.Start until all n were reported
// done (with -reports, until the pool stopped and their reports were
// stored).
func (bn *bench) burnDown(ctx context.Context, topic string, n int) (time.Duration, error) {
	obs := newBenchObserver(n, false)
	p := bn.newPool(topic, obs)
	start := time.Now()
	if err := p.Start(ctx); err != nil {
		return 0, err
	}
	timer := time.NewTimer(bn.cfg.timeout)
	defer timer.Stop()
	var err error
	select {
	case <-obs.all:
	case <-timer.C:
		err = fmt.Errorf("timed out after %s with %d of %d finished", bn.cfg.timeout, obs.finished.Load(), n)
	case <-ctx.Done():
		err = ctx.Err()
	}
	d := time.Since(start)
	if serr := bn.stopPool(p); err == nil && serr != nil {
		err = serr
	}
	if bn.cfg.reports {
		d = time.Since(start) // until the last report was stored
	}
	if err != nil {
		return 0, err
	}
	if nd := obs.notDone.Load(); nd > 0 {
		return 0, fmt.Errorf("%d of %d attempts did not end done", nd, n)
	}
	return d, bn.checkEmpty(ctx, topic)
}

// steady runs the steady stream on topic.
func (bn *bench) steady(ctx context.Context, topic string, r *benchResult) error {
	cfg := bn.cfg
	n := max(1, int(math.Round(cfg.rate*cfg.duration.Seconds())))
	r.SteadyN = n
	if err := bn.setLimit(ctx, topic); err != nil {
		return err
	}
	obs := newBenchObserver(n, true)
	p := bn.newPool(topic, obs)
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = bn.stopPool(p) }()
	// Let the pool open its connections and reach its idle poll.
	time.Sleep(500 * time.Millisecond)

	type sub struct {
		id     int64
		before time.Time
		after  time.Time
	}
	subs := make([]sub, n)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	sem := make(chan struct{}, 64)
	interval := time.Duration(float64(time.Second) / cfg.rate)
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			req := broker.SubmitRequest{Topic: topic, Task: benchTask, Payload: benchPayload(i)}
			before := time.Now()
			id, err := bn.b.Submit(ctx, req)
			after := time.Now()
			p.Wake()
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			subs[i] = sub{id: id, before: before, after: after}
		})
	}
	wg.Wait()
	submitted := time.Since(start)
	if firstErr != nil {
		return firstErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r.SteadyRate = float64(n) / submitted.Seconds()

	timer := time.NewTimer(cfg.timeout)
	defer timer.Stop()
	select {
	case <-obs.all:
	case <-timer.C:
		return fmt.Errorf("timed out with %d of %d finished", obs.finished.Load(), n)
	case <-ctx.Done():
		return ctx.Err()
	}
	if nd := obs.notDone.Load(); nd > 0 {
		return fmt.Errorf("%d of %d attempts did not end done", nd, n)
	}
	lat := make([]float64, 0, n)
	slat := make([]float64, 0, n)
	obs.mu.Lock()
	for _, s := range subs {
		fin, ok := obs.at[s.id]
		if !ok {
			obs.mu.Unlock()
			return fmt.Errorf("message %d was never reported finished", s.id)
		}
		lat = append(lat, ms(fin.Sub(s.before)))
		slat = append(slat, ms(s.after.Sub(s.before)))
	}
	obs.mu.Unlock()
	slices.Sort(lat)
	slices.Sort(slat)
	r.SteadyP50, r.SteadyP95, r.SteadyP99 = quantile(lat, 0.50), quantile(lat, 0.95), quantile(lat, 0.99)
	r.SteadyMax = lat[len(lat)-1]
	r.SubmitP50, r.SubmitP99 = quantile(slat, 0.50), quantile(slat, 0.99)
	return bn.checkEmpty(ctx, topic)
}

// claimDepths are the queue depths the claim-latency phase compares.
var claimDepths = []int{1_000, 1_000_000}

// claimLatency seeds each of claimDepths queued messages in a schema of its
// own (the bench's schema for the first, "<schema>_q<depth>" for the
// others, dropped at the end unless -keep), on a topic with the bench's
// limit, and times Claim of one message, -claim-samples times per depth
// and run. The depths take turns claim by claim, so a change in the
// machine's load weighs on all of them alike.
func (bn *bench) claimLatency(ctx context.Context) ([]claimResult, error) {
	cfg := bn.cfg
	if err := bn.reset(ctx); err != nil {
		return nil, err
	}
	type queue struct {
		depth int
		b     broker.Broker
		admin *pgx.Conn
		topic string
		lat   []float64
	}
	var queues []*queue
	for i, depth := range claimDepths {
		q := &queue{depth: depth, b: bn.b, admin: bn.admin, topic: bn.topic("claim", depth)}
		if i > 0 {
			schema := fmt.Sprintf("%s_q%d", bn.schema, depth)
			b, admin, undo, err := bn.openSchema(ctx, schema)
			if err != nil {
				return nil, err
			}
			defer undo()
			q.b, q.admin = b, admin
		}
		limit := cfg.limit
		if _, err := q.b.SetTopic(ctx, q.topic, broker.TopicPatch{ConcurrencyLimit: &limit}); err != nil {
			return nil, err
		}
		start := time.Now()
		if _, err := q.admin.Exec(ctx, `
			INSERT INTO tw_messages (topic, task, payload, available_at)
			SELECT $1, $2, jsonb_build_object('seq', i), now() - interval '1 hour' + i * interval '1 microsecond'
			FROM generate_series(1, $3::int) i`, q.topic, benchTask, depth); err != nil {
			return nil, err
		}
		if _, err := q.admin.Exec(ctx, `ANALYZE tw_messages`); err != nil {
			return nil, err
		}
		fmt.Fprintf(bn.out, "  seeded %d queued messages in %.1fs (INSERT ... generate_series, ANALYZE)\n", depth, time.Since(start).Seconds())
		queues = append(queues, q)
	}
	_, _ = bn.admin.Exec(ctx, `CHECKPOINT`)
	// Warm the connections' statement caches.
	for _, q := range queues {
		for range 20 {
			if _, err := claimOnce(ctx, q.b, q.topic); err != nil {
				return nil, err
			}
		}
	}
	var out []claimResult
	for run := 1; run <= cfg.runs; run++ {
		for _, q := range queues {
			q.lat = q.lat[:0]
		}
		for i := range cfg.claimSamples {
			for j := range queues {
				q := queues[(i+j)%len(queues)]
				d, err := claimOnce(ctx, q.b, q.topic)
				if err != nil {
					return nil, fmt.Errorf("%d queued: %w", q.depth, err)
				}
				q.lat = append(q.lat, ms(d))
			}
		}
		for _, q := range queues {
			var sum float64
			for _, v := range q.lat {
				sum += v
			}
			slices.Sort(q.lat)
			cr := claimResult{Depth: q.depth, Run: run, P50: quantile(q.lat, 0.5), P95: quantile(q.lat, 0.95), P99: quantile(q.lat, 0.99), Mean: sum / float64(len(q.lat))}
			fmt.Fprintf(bn.out, "  run %d  %8d queued: claim p50 %s  p95 %s  p99 %s  mean %s ms\n", run, q.depth, fmtNum(cr.P50), fmtNum(cr.P95), fmtNum(cr.P99), fmtNum(cr.Mean))
			out = append(out, cr)
		}
	}
	return out, nil
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

// claimOnce times one Claim of one message of topic and puts the message
// back (outside the timer).
func claimOnce(ctx context.Context, b broker.Broker, topic string) (time.Duration, error) {
	start := time.Now()
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "bench-claimer", Topics: []string{topic}, Max: 1})
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	if len(msgs) != 1 {
		return 0, fmt.Errorf("claimed %d messages, want 1", len(msgs))
	}
	return d, b.Nack(ctx, broker.NackRequest{Claim: msgs[0].ClaimOf(), Requeue: true})
}

// machineFacts describes the machine the bench runs on.
func machineFacts() map[string]string {
	m := map[string]string{
		"cpu":    "unknown",
		"cores":  strconv.Itoa(runtime.NumCPU()),
		"memory": "unknown",
		"go":     runtime.Version(),
		"os":     runtime.GOOS + "/" + runtime.GOARCH,
	}
	if v := procField("/proc/cpuinfo", "model name"); v != "" {
		m["cpu"] = v
	}
	if v := procField("/proc/meminfo", "MemTotal"); v != "" {
		if kb, err := strconv.ParseFloat(strings.Fields(v)[0], 64); err == nil {
			m["memory"] = fmt.Sprintf("%.1f GiB", kb/(1<<20))
		}
	}
	var osName string
	if v := procField("/etc/os-release", "PRETTY_NAME"); v != "" {
		osName = strings.Trim(v, `"`)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		osName = strings.TrimSpace(osName + " kernel " + strings.TrimSpace(string(b)))
	}
	if osName != "" {
		m["os"] += ", " + osName
	}
	return m
}

// procField returns the value of the first "key: value" or "key=value"
// line of path.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, key) {
			continue
		}
		rest := strings.TrimLeft(line[len(key):], " \t")
		if strings.HasPrefix(rest, ":") || strings.HasPrefix(rest, "=") {
			return strings.TrimSpace(rest[1:])
		}
	}
	return ""
}

var pgSettings = []string{"synchronous_commit", "shared_buffers", "max_connections", "fsync", "wal_level", "work_mem", "autovacuum", "full_page_writes"}

func postgresFacts(ctx context.Context, c *pgx.Conn) (map[string]string, error) {
	m := map[string]string{}
	var v string
	if err := c.QueryRow(ctx, `SELECT version()`).Scan(&v); err != nil {
		return nil, err
	}
	m["version"] = v
	for _, name := range pgSettings {
		if err := c.QueryRow(ctx, `SHOW `+name).Scan(&v); err != nil {
			return nil, err
		}
		m[name] = v
	}
	return m, nil
}

func redactedDSN(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "an unparsable dsn"
	}
	return fmt.Sprintf("host %s port %d database %s user %s", cfg.Host, cfg.Port, cfg.Database, cfg.User)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// quantile returns the nearest-rank q-quantile of sorted values.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func round2(f float64) float64 { return math.Round(f*100) / 100 }
func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// fmtNum prints a figure with a sensible number of digits.
func fmtNum(f float64) string {
	switch a := math.Abs(f); {
	case a >= 1000:
		return strconv.FormatFloat(math.Round(f), 'f', 0, 64)
	case a >= 100:
		return strconv.FormatFloat(f, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(f, 'f', 2, 64)
	default:
		return strconv.FormatFloat(f, 'f', 3, 64)
	}
}
