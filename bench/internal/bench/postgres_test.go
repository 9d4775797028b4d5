package bench

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/internal/testhost"
)

// summaryOf returns the JSON summary the bench printed last.
func summaryOf(t *testing.T, out string) map[string]any {
	t.Helper()
	_, line, ok := strings.Cut(out, "== summary (JSON)\n")
	if !ok {
		t.Fatalf("no summary in the output:\n%s", out)
	}
	line, _, _ = strings.Cut(line, "\n")
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		t.Fatalf("the summary is not JSON: %v\n%s", err, line)
	}
	return m
}

// assertReported checks, in schema, that the topics matching like have
// want success reports, one for each of want messages, and, when
// messagesKept (the bench empties the message table between phases),
// that those hold want messages, all done.
func assertReported(t *testing.T, schema, like string, want int, messagesKept bool) {
	t.Helper()
	c := testdb.Connect(t, schema)
	ctx := context.Background()
	var reported, reports int
	if err := c.QueryRow(ctx, `SELECT count(DISTINCT message_id), count(*) FROM tw_reports WHERE topic LIKE $1 AND status = 'success'`, like).Scan(&reported, &reports); err != nil {
		t.Fatal(err)
	}
	if reported != want || reports != want {
		t.Errorf("topics %s: %d messages with a success report, %d success reports; want %d of each", like, reported, reports, want)
	}
	if !messagesKept {
		return
	}
	var msgs, done int
	if err := c.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'done') FROM tw_messages_all WHERE topic LIKE $1`, like).Scan(&msgs, &done); err != nil {
		t.Fatal(err)
	}
	if msgs != want || done != want {
		t.Errorf("topics %s: %d messages, %d done; want %d of each", like, msgs, done, want)
	}
}

// TestPostgresBurnDownStoresReports runs the main phases on PostgreSQL in
// the default mode and checks that the burn-down stored a success report
// for every task, and printed its mode and WAL per message.
func TestPostgresBurnDownStoresReports(t *testing.T) {
	schema := testdb.FreshSchema(t, "tw_bench_")
	cfg := benchConfig{kind: "postgres", dsn: testdb.DSN(), schema: schema, keep: true,
		jobs: 300, workers: 8, limit: 8, rate: 100, duration: 200 * time.Millisecond,
		runs: 1, claimSamples: 1, submitters: 2, submitBatch: 100, timeout: 2 * time.Minute}
	var out strings.Builder
	if err := runBench(context.Background(), cfg, &out); err != nil {
		t.Fatalf("runBench: %v\n%s", err, out.String())
	}
	for _, want := range []string{"mode: with reports", "(with reports)  WAL ", "burn-down WAL"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
	sum := summaryOf(t, out.String())
	if sum["mode"] != "reports" {
		t.Errorf("summary mode = %v, want reports", sum["mode"])
	}
	if wal, _ := sum["burn_wal_bytes_per_msg"].(float64); wal <= 0 {
		t.Errorf("summary burn_wal_bytes_per_msg = %v, want a positive number", sum["burn_wal_bytes_per_msg"])
	}
	assertReported(t, schema, "bench-%-burn-1", cfg.jobs, false)
}

// TestRealHost runs the real-host phase with the host and tasks_worker
// binaries built from this tree, and checks in the database that every
// task it submitted through the API is done with its success report.
func TestRealHost(t *testing.T) {
	schema := testdb.FreshSchema(t, "tw_bench_")
	dir := t.TempDir()
	if err := testhost.Build(dir); err != nil {
		t.Fatal(err)
	}
	cfg := benchConfig{kind: "postgres", dsn: testdb.DSN(), schema: schema, keep: true, realHost: true,
		hostBin: filepath.Join(dir, "host"), jobs: 500, workers: 8, limit: 8, runs: 2, timeout: 3 * time.Minute}
	var out strings.Builder
	if err := runBench(context.Background(), cfg, &out); err != nil {
		t.Fatalf("runBench: %v\n%s", err, out.String())
	}
	for _, want := range []string{"mode: real host", "== real host: " + filepath.Join(dir, "host"), "run 2 ", "(real host)  WAL "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
	sum := summaryOf(t, out.String())
	if sum["mode"] != "real_host" {
		t.Errorf("summary mode = %v, want real_host", sum["mode"])
	}
	if v, _ := sum["burn_jobs_per_s"].(float64); v <= 0 {
		t.Errorf("summary burn_jobs_per_s = %v, want a positive number", sum["burn_jobs_per_s"])
	}
	// Each run starts from empty tables: the last run's tasks are there.
	assertReported(t, schema, "bench-%-host-0", cfg.jobs, true)
}

// TestRealHostProviderAfterResume runs the real-host phase on a provider
// plugin's task (example.noop), submitted on the paused topic and timed
// from its resume: every task is done with its success report.
func TestRealHostProviderAfterResume(t *testing.T) {
	schema := testdb.FreshSchema(t, "tw_bench_")
	dir := t.TempDir()
	if err := testhost.Build(dir); err != nil {
		t.Fatal(err)
	}
	cfg := benchConfig{kind: "postgres", dsn: testdb.DSN(), schema: schema, keep: true, realHost: true,
		hostBin: filepath.Join(dir, "host"), hostTask: "example.noop", hostPlugin: "example", resume: true, hostSteady: true,
		jobs: 500, workers: 8, limit: 8, runs: 1, rate: 100, duration: time.Second, timeout: 3 * time.Minute}
	var out strings.Builder
	if err := runBench(context.Background(), cfg, &out); err != nil {
		t.Fatalf("runBench: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "500 example.noop tasks") || !strings.Contains(out.String(), "submitted before the topic's resume") ||
		!strings.Contains(out.String(), "steady through the host  100 example.noop tasks at 100/s") {
		t.Errorf("the report does not say it ran example.noop from the resume, then steady:\n%s", out.String())
	}
	sum := summaryOf(t, out.String())
	if v, _ := sum["burn_jobs_per_s"].(float64); v <= 0 {
		t.Errorf("summary burn_jobs_per_s = %v, want a positive number", v)
	}
	if v, _ := sum["steady_p99_ms"].(float64); v <= 0 {
		t.Errorf("summary steady_p99_ms = %v, want a positive number", v)
	}
	// The steady stream's tasks, all done with their reports.
	assertReported(t, schema, "bench-%-host-0", 100, true)
}

// TestFlags checks that -reports is still accepted, that -pool-only
// turns the reports off, and the usage errors of -real-host.
func TestFlags(t *testing.T) {
	small := []string{"-broker", "memory", "-jobs", "20", "-workers", "2", "-runs", "1", "-rate", "100", "-duration", "50ms"}
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"the deprecated -reports is accepted", append(small, "-reports"), 0},
		{"-pool-only runs", append(small, "-pool-only"), 0},
		{"-real-host needs postgres", append(small, "-real-host"), 2},
		{"-real-host has its reports", []string{"-real-host", "-pool-only"}, 2},
		{"-task goes with -real-host", append(small, "-task", "example.noop"), 2},
		{"-resume goes with -real-host", append(small, "-resume"), 2},
		{"-steady goes with -real-host", append(small, "-steady"), 2},
		{"-plugin must be a plugin name", []string{"-real-host", "-plugin", "Not/A/Name"}, 2},
		{"an unknown broker", []string{"-broker", "nosuch", "-jobs", "1"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Main(tc.args); got != tc.want {
				t.Errorf("Main(%q) = %d, want %d", tc.args, got, tc.want)
			}
		})
	}
}
