package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/worker"
)

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

	reports *worker.ReportWriter // the last pool's, unless -pool-only
	dropped atomic.Int64         // reports it did not store
}

// benchResult is one run of the three main phases.
type benchResult struct {
	Run          int     `json:"run"`
	SubmitPerSec float64 `json:"submit_jobs_per_s"`
	BurnPerSec   float64 `json:"burn_jobs_per_s"`
	BurnSecs     float64 `json:"burn_s"`
	// BurnWALPerMsg is the WAL the database cluster wrote during the
	// burn-down per message (postgres).
	BurnWALPerMsg float64 `json:"burn_wal_bytes_per_msg,omitempty"`
	// BurnCPUPerMsg is the bench process's CPU time (user and system)
	// during the burn-down per message, in microseconds;
	// BurnMachineCPUPerMsg the whole machine's busy CPU time (Linux; with
	// a local database it includes the server's).
	BurnCPUPerMsg        float64 `json:"burn_cpu_us_per_msg"`
	BurnMachineCPUPerMsg float64 `json:"burn_machine_cpu_us_per_msg,omitempty"`
	SteadyN              int     `json:"steady_n"`
	SteadyRate           float64 `json:"steady_achieved_rate"`
	SteadyP50            float64 `json:"steady_p50_ms"`
	SteadyP95            float64 `json:"steady_p95_ms"`
	SteadyP99            float64 `json:"steady_p99_ms"`
	SteadyMax            float64 `json:"steady_max_ms"`
	SubmitP50            float64 `json:"steady_submit_p50_ms"`
	SubmitP99            float64 `json:"steady_submit_p99_ms"`
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

// modeKey names what the burn-down measures, in the summary's "mode".
func (bn *bench) modeKey() string {
	switch {
	case bn.cfg.realHost:
		return "real_host"
	case bn.cfg.poolOnly:
		return "pool_only"
	}
	return "reports"
}

// mode labels the burn-down's figures with what it measured.
func (bn *bench) mode() string {
	switch {
	case bn.cfg.realHost:
		return "(real host)"
	case bn.cfg.poolOnly:
		return "(pool only)"
	}
	return "(with reports)"
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
	summary := map[string]any{"broker": cfg.kind, "mode": bn.modeKey()}
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
		"reports": !cfg.poolOnly, "mode": bn.modeKey(),
		"gogc": gc,
	}
	submitVia := "Submit"
	if cfg.submitBatch > 1 {
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
	switch bn.modeKey() {
	case "real_host":
		fmt.Fprintln(out, "  mode: real host (-real-host): the host and tasks_worker plugin processes, which store a task report per attempt")
	case "pool_only":
		fmt.Fprintln(out, "  mode: pool only (-pool-only): no task reports; by default they are stored as the tasks_worker plugin stores them")
	default:
		fmt.Fprintln(out, "  mode: with reports: one task report per attempt, stored as the tasks_worker plugin stores them (-pool-only measures the pool alone)")
	}
	if !cfg.realHost {
		fmt.Fprintf(out, "  pool: worker.Pool, default options but Concurrency %d; a no-op task; topic concurrency limit %d\n", cfg.workers, cfg.limit)
		fmt.Fprintf(out, "  go gc: GOGC %s\n", gcNote(gc))
		fmt.Fprintf(out, "  bulk submit: %d messages via %s, %d goroutines\n", cfg.jobs, submitVia, cfg.submitters)
		fmt.Fprintf(out, "  burn-down: %d no-op tasks; steady: %g/s for %s (Submit then Pool.Wake, as the submit API does)\n", cfg.jobs, cfg.rate, cfg.duration)
	}
	fmt.Fprintf(out, "  runs: %d", cfg.runs)
	if cfg.claimLatency {
		fmt.Fprintf(out, "; claim latency: %d claims of 1 per run at 1,000 and 1,000,000 queued", cfg.claimSamples)
	}
	fmt.Fprintln(out)
	summary["params"] = params

	if cfg.acrossHosts || cfg.idlePools > 0 || cfg.realHost {
		phases := runHosts
		if cfg.realHost {
			phases = runRealHost
		}
		if err := phases(ctx, bn, out, summary); err != nil {
			return err
		}
		line, err := json.Marshal(summary)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, "== summary (JSON)")
		fmt.Fprintln(out, string(line))
		return nil
	}

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
	type medianRow struct {
		name, key string
		f         func(benchResult) float64
		unit      string
	}
	rows := []medianRow{
		{"bulk submit", "submit_jobs_per_s", func(r benchResult) float64 { return r.SubmitPerSec }, "jobs/s"},
		{"burn-down " + bn.mode(), "burn_jobs_per_s", func(r benchResult) float64 { return r.BurnPerSec }, "jobs/s"},
		{"steady p50", "steady_p50_ms", func(r benchResult) float64 { return r.SteadyP50 }, "ms"},
		{"steady p95", "steady_p95_ms", func(r benchResult) float64 { return r.SteadyP95 }, "ms"},
		{"steady p99", "steady_p99_ms", func(r benchResult) float64 { return r.SteadyP99 }, "ms"},
		{"steady submit p50", "steady_submit_p50_ms", func(r benchResult) float64 { return r.SubmitP50 }, "ms"},
		{"steady achieved rate", "steady_achieved_rate", func(r benchResult) float64 { return r.SteadyRate }, "/s"},
	}
	cpuRows := []medianRow{{"burn-down CPU, process", "burn_cpu_us_per_msg", func(r benchResult) float64 { return r.BurnCPUPerMsg }, "us/msg"}}
	if results[0].BurnMachineCPUPerMsg > 0 {
		cpuRows = append(cpuRows, medianRow{"burn-down CPU, machine", "burn_machine_cpu_us_per_msg", func(r benchResult) float64 { return r.BurnMachineCPUPerMsg }, "us/msg"})
	}
	rows = slices.Insert(rows, 2, cpuRows...)
	if bn.admin != nil {
		rows = slices.Insert(rows, 2, medianRow{"burn-down WAL", "burn_wal_bytes_per_msg", func(r benchResult) float64 { return r.BurnWALPerMsg }, "B/msg"})
	}
	for _, row := range rows {
		m := med(row.f)
		var each []string
		for _, r := range results {
			each = append(each, fmtNum(row.f(r)))
		}
		fmt.Fprintf(out, "  %-26s %10s %-6s (runs: %s)\n", row.name, fmtNum(m), row.unit, strings.Join(each, ", "))
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
			fmt.Fprintf(out, "  %-26s %10s ms     (p99 %s ms)\n", fmt.Sprintf("claim p50 @ %d", depth), fmtNum(median(v)), fmtNum(median(v99)))
		}
		ratio := p50[1_000_000] / p50[1_000]
		summary["claim_ratio_1m_1k"] = round2(ratio)
		fmt.Fprintf(out, "  %-26s %10.2f x\n", "claim p50 1M / 1k", ratio)
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
