package postgres

import (
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/internal/testdb"
)

func TestStatisticsAreStaleByAutovacuumsRule(t *testing.T) {
	for _, c := range []struct {
		name      string
		s         tableStats
		submitted int64
		want      bool
	}{
		{"never analyzed, nothing written", tableStats{tuples: -1, since: -1}, 0, false},
		{"never analyzed, 49 rows written", tableStats{tuples: -1, modified: 49, since: -1}, 0, false},
		{"never analyzed, 50 rows written", tableStats{tuples: -1, modified: 50, since: -1}, 0, true},
		{"never analyzed, the server's counts behind this broker's submits", tableStats{tuples: -1, since: -1}, 1000, true},
		{"truncated just after an analyze", tableStats{tuples: -1, modified: 5000, since: time.Second}, 0, true},
		{"analyzed a moment ago", tableStats{tuples: 10, modified: 1_000_000, since: time.Second}, 0, false},
		{"a tenth of a million rows changed", tableStats{tuples: 1_000_000, modified: 100_049, since: time.Hour}, 0, false},
		{"a tenth of a million rows and 50 changed", tableStats{tuples: 1_000_000, modified: 100_050, since: time.Hour}, 0, true},
		{"analyzed, never by this rule's clock", tableStats{tuples: 100, modified: 60, since: -1}, 0, true},
	} {
		if got := analyzeStale(c.s, c.submitted); got != c.want {
			t.Errorf("%s: analyzeStale(%+v, %d) = %v, want %v", c.name, c.s, c.submitted, got, c.want)
		}
	}
}

// TestAQueueNobodyAnalyzedIsAnalyzed: on a table that nothing analyzes
// (the test's server may run autovacuum, but not within the moments this
// takes), the broker gathers the statistics itself once a batch is
// submitted, and the planner then sees that the queued messages have no
// unique key, rather than guessing 1 in 200.
func TestAQueueNobodyAnalyzedIsAnalyzed(t *testing.T) {
	b := newTestBroker(t, Options{})
	c := schemaConn(t, b)
	ctx := t.Context()
	if s, err := readTableStats(ctx, c, "tw_messages"); err != nil || s.tuples >= 0 {
		t.Fatalf("a new schema's tw_messages: statistics %+v, %v; want none yet", s, err)
	}
	const n = 2000
	reqs := make([]broker.SubmitRequest, n)
	for i := range reqs {
		reqs[i] = broker.SubmitRequest{Topic: "q", Task: "t"}
	}
	if _, err := b.SubmitMany(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the broker to analyze tw_messages", func() bool {
		s, err := readTableStats(ctx, c, "tw_messages")
		if err != nil {
			t.Fatal(err)
		}
		return s.tuples >= 0
	})
	plan := explain(t, c, `SELECT 1 FROM tw_messages WHERE unique_key IS NULL`)
	m := regexp.MustCompile(`rows=(\d+)`).FindStringSubmatch(plan)
	if m == nil {
		t.Fatalf("no row estimate in the plan:\n%s", plan)
	}
	if rows, _ := strconv.Atoi(m[1]); rows < n/2 {
		t.Errorf("the planner estimates %d of the %d queued messages without a unique key:\n%s", rows, n, plan)
	}
}

// TestBrokersSharingASchemaAnalyzeItOnce: two brokers (as two processes
// would) find the same stale statistics at once, and the table is
// analyzed once: the one that does not get the lock goes on without
// waiting for it; and a check right after, with as many submits again,
// finds the statistics fresh.
func TestBrokersSharingASchemaAnalyzeItOnce(t *testing.T) {
	b := newTestBroker(t, Options{})
	other, err := New(t.Context(), Options{DSN: testdb.DSN(), Schema: b.schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	c := schemaConn(t, b)
	execAll(t, c, `INSERT INTO tw_messages (topic, task) SELECT 'q', 't' FROM generate_series(1, 2000)`)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, k := range []*statsKeeper{b.stats, other.stats} {
		wg.Go(func() { errs[i] = k.check(2000) })
	}
	wg.Wait()
	errs = append(errs, other.stats.check(2000), b.stats.check(2000))
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var n int64
	if err := c.QueryRow(t.Context(), `SELECT pg_stat_get_analyze_count('tw_messages'::regclass)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("tw_messages was analyzed %d times by two brokers that found it stale at once, then checked it again; want 1", n)
	}
}
