package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestMemoryBench runs every phase once against the memory broker and
// checks the report's sections.
func TestMemoryBench(t *testing.T) {
	cfg := benchConfig{kind: "memory", jobs: 100, workers: 4, limit: 4, rate: 200, duration: 100 * time.Millisecond,
		runs: 1, claimSamples: 1, submitters: 2, submitBatch: 10, timeout: time.Minute}
	var out strings.Builder
	if err := runBench(context.Background(), cfg, &out); err != nil {
		t.Fatalf("runBench: %v\n%s", err, out.String())
	}
	for _, want := range []string{"== machine", "== parameters", "== run 1/1", "bulk submit", "burn-down", "(with reports)", "steady", "== medians of 1 runs", "== summary (JSON)\n{\"broker\":\"memory\""} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "WAL") {
		t.Errorf("the memory broker has no WAL, yet the report shows one:\n%s", out.String())
	}
}

func TestStats(t *testing.T) {
	sorted := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if q := quantile(sorted, 0.5); q != 5 {
		t.Errorf("p50 = %v, want 5", q)
	}
	if q := quantile(sorted, 0.99); q != 10 {
		t.Errorf("p99 = %v, want 10", q)
	}
	if m := median([]float64{3, 1, 2, 4}); m != 2.5 {
		t.Errorf("median = %v, want 2.5", m)
	}
	for f, want := range map[float64]string{12345.6: "12346", 123.45: "123.5", 1.234: "1.23", 0.12345: "0.123"} {
		if got := fmtNum(f); got != want {
			t.Errorf("fmtNum(%v) = %q, want %q", f, got, want)
		}
	}
}
