package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/taskhost/taskhost/client"
	"github.com/taskhost/taskhost/internal/hostproc"
	"github.com/taskhost/taskhost/plugins/tasksworker"
)

// This file holds the real-host phase (-real-host): what a user runs,
// end to end. The bench starts the host binary, which starts the
// tasks_worker plugin binary, configured on the postgres broker in the
// bench's schema with -workers workers and a topic limited to -limit.
// Each run submits -jobs tasks (-task, demo.echo by default, or a task of
// the plugin -plugin names, which the host runs too) through the HTTP API,
// as one NDJSON stream to POST tasks/batch (client.SubmitBatch, what `host
// tasks submit -file` does), and times them from just before the first
// submit until the database holds all of them done, each with its success
// report; with -resume, they are submitted on the paused topic, and timed
// from its resume. The bench reads the database every 10 ms: messages still queued
// or running on the topic, then the counts of done messages and success
// reports.
//
// The host and its plugin run for all runs of the phase and are stopped
// at its end, also when the bench is interrupted (SIGINT or SIGTERM).

// realHostTask is the plugin's built-in task the phase submits: it returns
// its payload.
const realHostTask = "demo.echo"

// realHostPoll is how often the phase reads the database for completion.
const realHostPoll = 10 * time.Millisecond

// realHostResult is one run of the real-host phase.
type realHostResult struct {
	Run          int     `json:"run"`
	JobsPerSec   float64 `json:"burn_jobs_per_s"`
	Secs         float64 `json:"burn_s"`
	WALPerMsg    float64 `json:"burn_wal_bytes_per_msg"`
	SubmitPerSec float64 `json:"submit_jobs_per_s"`
}

// realHostBinaries returns the host binary and the plugins directory the
// phase runs, as absolute paths: from -host-bin, else the build this
// bench runs from (bin/taskhost-bench beside bin/host and bin/plugins).
func realHostBinaries(hostBin string) (host, pluginsDir string, err error) {
	if hostBin == "" {
		if hostBin, err = os.Executable(); err != nil {
			return "", "", fmt.Errorf("finding this binary (give -host-bin): %w", err)
		}
	}
	return hostproc.Binaries(hostBin)
}

// realHostConfig is the host's configuration (after listen and
// plugins_dir): tasks_worker alone, on the bench's schema, with the
// database address in its environment rather than in the file.
func realHostConfig(cfg benchConfig, schema, topic string) string {
	conf := fmt.Sprintf(`plugins:
  tasks_worker:
    enabled: true
    env: [%s]
    config:
      broker: postgres
      schema: %s
      workers: %d
      topics:
        %s: {concurrency_limit: %d}
`, tasksworker.DSNEnv, schema, cfg.workers, topic, cfg.limit)
	if cfg.hostPlugin != "" {
		conf += fmt.Sprintf("  %s:\n    enabled: true\n", cfg.hostPlugin)
	}
	if cfg.readers {
		conf += "  metrics:\n    enabled: true\n"
	}
	return conf
}

// runRealHost runs the real-host phase -runs times, printing every run and
// the medians, and fills summary.
func runRealHost(ctx context.Context, bn *bench, out io.Writer, summary map[string]any) (err error) {
	if bn.cfg.hostTask == "" {
		bn.cfg.hostTask = realHostTask
	}
	cfg := bn.cfg
	hostBin, pluginsDir, err := realHostBinaries(cfg.hostBin)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "taskhost-bench-host-")
	if err != nil {
		return err
	}
	defer func() {
		if cfg.keep || (err != nil && ctx.Err() == nil) {
			fmt.Fprintf(out, "kept the host's directory %s (configuration and host.log)\n", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()
	logPath := filepath.Join(dir, "host.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	var hostOut io.Writer = logFile
	if cfg.verbose {
		hostOut = io.MultiWriter(logFile, os.Stderr)
	}
	// A plain topic name: it goes into the configuration as it is.
	topic := bn.topic("host", 0)
	fmt.Fprintf(out, "== real host: %s with the tasks_worker plugin of %s (broker postgres, schema %s, workers %d, topic limit %d)\n",
		hostBin, pluginsDir, bn.schema, cfg.workers, cfg.limit)
	timed := "timed from the first submit"
	if cfg.resume {
		timed = "submitted on the paused topic, timed from its resume"
	}
	fmt.Fprintf(out, "  each run: %d %s tasks through POST tasks/batch (NDJSON, one stream), %s until the database holds them all done with their success reports\n",
		cfg.jobs, cfg.hostTask, timed)
	p, err := hostproc.Start(ctx, hostproc.Options{
		Host:       hostBin,
		PluginsDir: pluginsDir,
		ConfigPath: filepath.Join(dir, "taskhost.yaml"),
		Config:     realHostConfig(cfg, bn.schema, topic),
		Env:        []string{tasksworker.DSNEnv + "=" + cfg.dsn},
		Output:     hostOut,
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("starting the host: %w%s", err, logTail(logPath))
	}
	defer p.Stop()
	c := client.New(p.URL)
	if err := awaitTask(ctx, c, cfg.hostTask, topic, p.Exited()); err != nil {
		return fmt.Errorf("real host: %w%s", err, logTail(logPath))
	}

	var stopReaders func() []readerResult
	if cfg.readers {
		stopReaders = startReaders(ctx, p.URL)
	}
	var results []realHostResult
	for run := 1; run <= cfg.runs; run++ {
		r, err := bn.realHostRun(ctx, c, topic, run, p.Exited())
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return fmt.Errorf("real host, run %d: %w%s", run, err, logTail(logPath))
		}
		submitted := "submitted before the topic's resume"
		if !cfg.resume {
			submitted = fmt.Sprintf("submitted in %.3fs, %s/s", float64(cfg.jobs)/r.SubmitPerSec, fmtNum(r.SubmitPerSec))
		}
		fmt.Fprintf(out, "  run %d  %8d jobs in %7.3fs  %10s jobs/s  %s  WAL %s B/message  (%s)\n",
			run, cfg.jobs, r.Secs, fmtNum(r.JobsPerSec), bn.mode(), fmtNum(r.WALPerMsg), submitted)
		results = append(results, r)
	}
	if stopReaders != nil {
		rr := stopReaders()
		for _, r := range rr {
			fmt.Fprintf(out, "  reader %-10s every %-4s %3d reads  median %s ms  max %s ms  failed %d\n",
				r.Name, r.Every, r.N, fmtNum(r.MedianMS), fmtNum(r.MaxMS), r.Failed)
		}
		summary["readers"] = rr
	}
	fmt.Fprintf(out, "== medians of %d runs\n", len(results))
	for _, row := range []struct {
		name, key, unit string
		f               func(realHostResult) float64
	}{
		{"real host", "burn_jobs_per_s", "jobs/s", func(r realHostResult) float64 { return r.JobsPerSec }},
		{"real host WAL", "burn_wal_bytes_per_msg", "B/msg", func(r realHostResult) float64 { return r.WALPerMsg }},
		{"submit (HTTP batch)", "submit_jobs_per_s", "jobs/s", func(r realHostResult) float64 { return r.SubmitPerSec }},
	} {
		v := make([]float64, len(results))
		each := make([]string, len(results))
		for i, r := range results {
			v[i], each[i] = row.f(r), fmtNum(row.f(r))
		}
		fmt.Fprintf(out, "  %-26s %10s %-6s (runs: %s)\n", row.name, fmtNum(median(v)), row.unit, strings.Join(each, ", "))
		summary[row.key] = round2(median(v))
	}
	summary["runs"] = results
	if cfg.hostSteady {
		st, err := bn.realHostSteady(ctx, c, topic, p.Exited())
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return fmt.Errorf("real host, steady: %w%s", err, logTail(logPath))
		}
		fmt.Fprintf(out, "  steady through the host  %d %s tasks at %.0f/s  latency (created to finished) p50 %s  p95 %s  p99 %s  max %s ms\n",
			st.N, cfg.hostTask, cfg.rate, fmtNum(st.P50), fmtNum(st.P95), fmtNum(st.P99), fmtNum(st.Max))
		summary["steady"] = st
		summary["steady_p99_ms"] = round2(st.P99)
	}
	return nil
}

// realHostSteadyResult is the steady stream through the host.
type realHostSteadyResult struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// realHostSteady submits -rate tasks a second for -duration through the
// host, one POST tasks each, and reads each one's latency from the
// database once all are done: from its created_at (its insert) to its
// finished_at (its outcome), both the database's clock.
func (bn *bench) realHostSteady(ctx context.Context, c *client.Client, topic string, exited <-chan struct{}) (realHostSteadyResult, error) {
	cfg := bn.cfg
	n := max(1, int(math.Round(cfg.rate*cfg.duration.Seconds())))
	r := realHostSteadyResult{N: n}
	if err := bn.emptyTables(ctx); err != nil {
		return r, err
	}
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
			return r, ctx.Err()
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := c.Submit(ctx, client.Task{Task: cfg.hostTask, Topic: topic, Payload: benchPayload(i)}); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return r, fmt.Errorf("submitting through %s: %w", c.BaseURL(), firstErr)
	}
	deadline := time.Now().Add(cfg.timeout)
	for {
		done, reports, err := bn.finished(ctx, topic)
		if err != nil {
			return r, err
		}
		if done == int64(n) && reports == int64(n) {
			break
		}
		select {
		case <-exited:
			return r, errors.New("the host exited")
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(realHostPoll):
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("timed out after %s with %d of %d done", cfg.timeout, done, n)
		}
	}
	err := bn.admin.QueryRow(ctx, `SELECT
		percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.95) WITHIN GROUP (ORDER BY ms),
		percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms)
		FROM (SELECT extract(epoch FROM finished_at - created_at) * 1000 AS ms FROM tw_messages_all WHERE topic = $1 AND state = 'done') l`,
		topic).Scan(&r.P50, &r.P95, &r.P99, &r.Max)
	return r, err
}

// emptyTables empties the tables a real-host run fills. The host's own
// reads (with -readers, the dashboard's and the scrape's) take their locks
// in another order than TRUNCATE does, so PostgreSQL may pick the TRUNCATE
// as a deadlock's victim: it is tried again.
func (bn *bench) emptyTables(ctx context.Context) error {
	for try := 1; ; try++ {
		_, err := bn.admin.Exec(ctx, `TRUNCATE tw_messages, tw_locks, tw_report_rows, tw_done`)
		var pgErr *pgconn.PgError
		if err == nil || try == 5 || !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
			return err
		}
	}
}

// realHostRun is one run of the real-host phase on topic.
func (bn *bench) realHostRun(ctx context.Context, c *client.Client, topic string, run int, exited <-chan struct{}) (realHostResult, error) {
	n := bn.cfg.jobs
	r := realHostResult{Run: run}
	// The reports too: the run counts those of topic.
	if err := bn.emptyTables(ctx); err != nil {
		return r, err
	}
	// A checkpoint, as after the main phases' seed, but no ANALYZE: the
	// host's broker gathers the statistics of what the run submits, as it
	// does for any user whose server's autovacuum is off or behind.
	bn.checkpoint(ctx)
	var wal walMeter
	if err := wal.start(ctx, bn.admin); err != nil {
		return r, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type submitted struct {
		res client.BatchResult
		err error
		at  time.Time
	}
	subDone := make(chan submitted, 1)
	if bn.cfg.resume {
		paused := true
		if err := c.SetTopic(ctx, topic, client.TopicPatch{Paused: &paused}); err != nil {
			return r, fmt.Errorf("pausing topic %s: %w", topic, err)
		}
	}
	start := time.Now()
	go func() {
		res, err := c.SubmitBatch(ctx, realHostTasks(bn.cfg.hostTask, topic, n))
		subDone <- submitted{res, err, time.Now()}
	}()
	if bn.cfg.resume {
		s := <-subDone
		if s.err != nil {
			return r, fmt.Errorf("submitting through %s: %w", c.BaseURL(), s.err)
		}
		subDone <- s
		start = time.Now()
		paused := false
		if err := c.SetTopic(ctx, topic, client.TopicPatch{Paused: &paused}); err != nil {
			return r, fmt.Errorf("resuming topic %s: %w", topic, err)
		}
	}

	timeout := time.NewTimer(bn.cfg.timeout)
	defer timeout.Stop()
	tick := time.NewTicker(realHostPoll)
	defer tick.Stop()
	var (
		sub     *submitted
		pending = true
	)
	for {
		select {
		case s := <-subDone:
			if s.err != nil {
				return r, fmt.Errorf("submitting through %s: %w", c.BaseURL(), s.err)
			}
			if s.res.Stored != n {
				return r, fmt.Errorf("the host stored %d of %d tasks", s.res.Stored, n)
			}
			sub = &s
		case <-tick.C:
		case <-exited:
			return r, errors.New("the host exited")
		case <-timeout.C:
			done, reports, _ := bn.finished(ctx, topic)
			return r, fmt.Errorf("timed out after %s with %d of %d done and %d success reports", bn.cfg.timeout, done, n, reports)
		case <-ctx.Done():
			return r, ctx.Err()
		}
		if sub == nil {
			continue
		}
		if pending {
			// The topic's kept count of queued rows (held ones, which run,
			// included) and a look into the partial index of rows made
			// running the old way, which stays empty: a few rows, whatever
			// the run has done. A look into the queued index instead would
			// walk, every 10 ms, the entries of every message acked so far,
			// which only VACUUM removes, and slow the run as it goes.
			if err := bn.admin.QueryRow(ctx, `SELECT (SELECT coalesce(sum(queued), 0) FROM tw_topic_counts WHERE topic = $1) > 0
				OR EXISTS (SELECT 1 FROM tw_messages WHERE topic = $1 AND state = 'running')`, topic).Scan(&pending); err != nil {
				return r, err
			}
			if pending {
				continue
			}
		}
		done, reports, err := bn.finished(ctx, topic)
		if err != nil {
			return r, err
		}
		if done != int64(n) {
			return r, fmt.Errorf("nothing is queued or running, but %d of %d tasks are done", done, n)
		}
		if reports == int64(n) {
			break
		}
	}
	d := time.Since(start)
	r.Secs = d.Seconds()
	r.JobsPerSec = float64(n) / d.Seconds()
	if !bn.cfg.resume {
		r.SubmitPerSec = float64(n) / sub.at.Sub(start).Seconds()
	}
	var err error
	r.WALPerMsg, err = wal.perMessage(ctx, n)
	return r, err
}

// realHostTasks yields the n tasks of a run.
func realHostTasks(task, topic string, n int) iter.Seq[client.Task] {
	return func(yield func(client.Task) bool) {
		for i := range n {
			if !yield(client.Task{Task: task, Topic: topic, Payload: benchPayload(i)}) {
				return
			}
		}
	}
}

// awaitTask waits until tasks_worker takes a submit of task on topic (a
// provider plugin's tasks are registered once its plugin runs), and runs
// that one, so that the first run does not wait for the plugin.
func awaitTask(ctx context.Context, c *client.Client, task, topic string, exited <-chan struct{}) error {
	deadline := time.Now().Add(time.Minute)
	for {
		id, err := c.Submit(ctx, client.Task{Task: task, Topic: topic, Payload: benchPayload(0)})
		if err == nil {
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			_, err = c.Wait(wctx, id)
			return err
		}
		select {
		case <-exited:
			return errors.New("the host exited")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tasks_worker did not take task %s within a minute (is its plugin enabled with -plugin?): %w", task, err)
		}
	}
}

// logTail is the end of the host's log at path, for an error message.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return "\nthe host's log ends with:\n" + string(bytes.Join(lines, []byte("\n")))
}

// readerResult is what one of the operator's reads took during the runs.
type readerResult struct {
	Name     string  `json:"name"`
	Every    string  `json:"every"`
	N        int     `json:"n"`
	Failed   int     `json:"failed"`
	MedianMS float64 `json:"median_ms"`
	MaxMS    float64 `json:"max_ms"`
}

// startReaders runs an operator's reads against the host at base, each on
// its own period, until the returned stop, which reports what they took:
// the task UI's dashboard, as an open browser tab reloads it, and the
// Prometheus scrape.
func startReaders(ctx context.Context, base string) (stop func() []readerResult) {
	readers := []struct {
		name, path string
		every      time.Duration
	}{
		{"dashboard", "/plugin-pkg/tasks_worker/ui/", 5 * time.Second},
		{"scrape", "/plugin-pkg/metrics/api/prometheus", 15 * time.Second},
	}
	ctx, cancel := context.WithCancel(ctx)
	results := make([]readerResult, len(readers))
	var wg sync.WaitGroup
	for i, rd := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: time.Minute}
			var took []float64
			failed := 0
			t := time.NewTicker(rd.every)
			defer t.Stop()
			for {
				start := time.Now()
				req, _ := http.NewRequestWithContext(ctx, "GET", base+rd.path, nil)
				resp, err := hc.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				switch {
				case ctx.Err() != nil:
				case err != nil:
					failed++
				default:
					took = append(took, float64(time.Since(start).Microseconds())/1000)
				}
				select {
				case <-ctx.Done():
					r := readerResult{Name: rd.name, Every: rd.every.String(), N: len(took), Failed: failed}
					if len(took) > 0 {
						r.MedianMS = round2(median(took))
						r.MaxMS = round2(slices.Max(took))
					}
					results[i] = r
					return
				case <-t.C:
				}
			}
		}()
	}
	return func() []readerResult {
		cancel()
		wg.Wait()
		return results
	}
}
