package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ---- the workload ----

// submitAll submits nLim tasks on the limited topic and nFree on the free
// one, demo.sleep of 0.2 to 1 s each, spread over the hosts that answer.
func submitAll(t *testing.T, hs []*host, nLim, nFree int) []int64 {
	t.Helper()
	type job struct{ topic string }
	jobs := make(chan job)
	var (
		mu  sync.Mutex
		ids []int64
		wg  sync.WaitGroup
	)
	for w := range 4 {
		wg.Go(func() {
			n := w
			for j := range jobs {
				secs := 0.2 + 0.8*rand.Float64()
				secs = float64(int(secs*100)) / 100
				deadline := time.Now().Add(30 * time.Second)
				for {
					h := hs[n%len(hs)]
					n++
					id, err := h.submit("demo.sleep", j.topic, map[string]any{"seconds": secs})
					if err == nil {
						mu.Lock()
						ids = append(ids, id)
						mu.Unlock()
						break
					}
					if time.Now().After(deadline) {
						t.Errorf("no host takes a submit for 30 s: %v", err)
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	topics := make([]string, 0, nLim+nFree)
	for i := range nLim + nFree {
		topic := "free"
		if i < nLim {
			topic = "lim"
		}
		topics = append(topics, topic)
	}
	rand.Shuffle(len(topics), func(i, j int) { topics[i], topics[j] = topics[j], topics[i] })
	for _, topic := range topics {
		jobs <- job{topic}
	}
	close(jobs)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return ids
}

// ---- the database, seen directly ----

// db is a direct connection to the scenario's schema (not through the
// proxy), for the checks.
func (e *env) dbConn(t *testing.T, schema string) *pgx.Conn {
	t.Helper()
	c, err := e.pg.connect(dbName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	if _, err := c.Exec(context.Background(), "SET search_path TO "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return c
}

// dbQuery runs f on a fresh direct connection (the sampler's connection
// breaks when PostgreSQL restarts).
type dbSampler struct {
	e      *env
	schema string
	c      *pgx.Conn
}

func (s *dbSampler) running(topic string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if s.c == nil || s.c.IsClosed() {
		c, err := s.e.pg.connect(dbName)
		if err != nil {
			return 0, err
		}
		if _, err := c.Exec(ctx, "SET search_path TO "+pgx.Identifier{s.schema}.Sanitize()); err != nil {
			c.Close(ctx)
			return 0, err
		}
		s.c = c
	}
	var n int
	err := s.c.QueryRow(ctx, `SELECT (SELECT count(*) FROM tw_messages WHERE topic = $1 AND state = 'running')
		+ (SELECT coalesce(sum(cardinality(ids)), 0) FROM tw_claims WHERE topic = $1)`, topic).Scan(&n)
	if err != nil {
		s.c.Close(ctx)
		s.c = nil
	}
	return n, err
}

// terminal counts the messages of ids in a terminal state.
func terminal(c *pgx.Conn, ids []int64) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	err := c.QueryRow(ctx, `SELECT count(*) FROM tw_messages_all WHERE id = ANY($1) AND state IN ('done', 'failed', 'dead')`, ids).Scan(&n)
	return n, err
}

// waitTerminal waits until every message of ids is in a terminal state.
func waitTerminal(t *testing.T, c *pgx.Conn, ids []int64, timeout time.Duration) {
	t.Helper()
	last := 0
	waitFor(t, timeout, fmt.Sprintf("all %d messages end (last count %d)", len(ids), last), func() bool {
		n, err := terminal(c, ids)
		if err == nil {
			last = n
		}
		return err == nil && n == len(ids)
	})
}

// ---- sampling while the scenario runs ----

// answer is one host's /api/health answer.
type answer struct {
	host       string
	start, end time.Time
	ok         bool
	h          health
}

// sampler samples, every 100 ms, the running count of the limited topic
// in the database and every host's /api/health.
type sampler struct {
	mu         sync.Mutex
	maxRunning int
	overLimit  []string
	dbSamples  int
	answers    []answer
	quit       chan struct{}
	paused     atomic.Bool // no health sampling (the database is down: each would try to connect)
	wg         sync.WaitGroup
	once       sync.Once
}

func startSampler(t *testing.T, e *env, schema string, hs []*host) *sampler {
	s := &sampler{quit: make(chan struct{})}
	ds := &dbSampler{e: e, schema: schema}
	s.wg.Go(func() {
		defer func() {
			if ds.c != nil {
				ds.c.Close(context.Background())
			}
		}()
		for {
			select {
			case <-s.quit:
				return
			case <-time.After(100 * time.Millisecond):
			}
			n, err := ds.running("lim")
			if err != nil {
				continue
			}
			s.mu.Lock()
			s.dbSamples++
			s.maxRunning = max(s.maxRunning, n)
			if n > topicLimit {
				s.overLimit = append(s.overLimit, fmt.Sprintf("%s: %d running", time.Now().Format("15:04:05.000"), n))
			}
			s.mu.Unlock()
		}
	})
	for _, h := range hs {
		s.wg.Go(func() {
			for {
				select {
				case <-s.quit:
					return
				case <-time.After(100 * time.Millisecond):
				}
				if s.paused.Load() {
					continue
				}
				a := answer{host: h.name, start: time.Now()}
				a.ok = h.get("/health", &a.h) == nil
				a.end = time.Now()
				s.mu.Lock()
				s.answers = append(s.answers, a)
				s.mu.Unlock()
			}
		})
	}
	t.Cleanup(func() { s.stop() })
	return s
}

func (s *sampler) stop() {
	s.once.Do(func() { close(s.quit) })
	s.wg.Wait()
}

// leaders returns the answers that said "leader", in order of start.
func (s *sampler) leaders() []answer {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []answer
	for _, a := range s.answers {
		if a.ok && a.h.Beat.Leader {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out
}

// leaderViolations: a term claimed by two workers, or a worker that says
// it leads at a term in an answer it began after another worker's answer
// had said it leads at a later term (both then led at once).
func (s *sampler) leaderViolations() (terms int, bad []string) {
	ls := s.leaders()
	byTerm := map[int64]map[string]bool{}
	for _, a := range ls {
		if byTerm[a.h.Beat.Term] == nil {
			byTerm[a.h.Beat.Term] = map[string]bool{}
		}
		byTerm[a.h.Beat.Term][a.h.WorkerID] = true
	}
	for term, ws := range byTerm {
		if len(ws) > 1 {
			bad = append(bad, fmt.Sprintf("term %d claimed by %d workers: %v", term, len(ws), keys(ws)))
		}
	}
	// firstEnd[term] is the earliest end of an answer claiming term.
	firstEnd := map[int64]answer{}
	for _, a := range ls {
		if f, ok := firstEnd[a.h.Beat.Term]; !ok || a.end.Before(f.end) {
			firstEnd[a.h.Beat.Term] = a
		}
	}
	for _, a := range ls {
		for term, f := range firstEnd {
			if term > a.h.Beat.Term && f.h.WorkerID != a.h.WorkerID && a.start.After(f.end) {
				bad = append(bad, fmt.Sprintf("%s (%s) said it leads at term %d in an answer begun at %s, after %s (%s) said it leads at term %d (answered %s)",
					a.host, a.h.WorkerID, a.h.Beat.Term, a.start.Format("15:04:05.000"), f.host, f.h.WorkerID, term, f.end.Format("15:04:05.000")))
				break
			}
		}
	}
	return len(byTerm), bad
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ---- the beat's terms, from the hosts' logs ----

var (
	// "task reports not stored" (worker/reports.go) with its count.
	droppedRe = regexp.MustCompile(`task reports not stored:.* reports=(\d+)`)
	// hclog writes a line's fields in any order.
	electedRe = regexp.MustCompile(`^(\S+) .*elected leader:.* term=(\d+)`)
	// A leader steps down at its renewal deadline, before its lease can
	// run out ("could not be renewed in time"), or late, on finding
	// another holder ("to another process"; the line's term is its own).
	endedRe = regexp.MustCompile(`^(\S+) .*leadership lost(?:: the lease could not be renewed in time| to another process):.* term=(\d+)`)
	// How long a deposed leader's work took to return once told to stop.
	stoppedRe = regexp.MustCompile(`the term's work stopped:.* took=(\S+)`)
)

// termsFromLogs reads every "elected leader" and "leadership lost" line of
// the hosts' logs: the hosts elected at each term, when each term first
// began and when it last ended, and the longest a deposed leader's work
// took to stop.
func termsFromLogs(hs []*host) (elected map[int64][]string, began, ended map[int64]time.Time, stopTook time.Duration) {
	elected, began, ended = map[int64][]string{}, map[int64]time.Time{}, map[int64]time.Time{}
	for _, h := range hs {
		b, err := os.ReadFile(h.logPath)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if m := stoppedRe.FindStringSubmatch(line); m != nil {
				if d, err := time.ParseDuration(m[1]); err == nil {
					stopTook = max(stopTook, d)
				}
			}
			for _, x := range []struct {
				re *regexp.Regexp
				at map[int64]time.Time
			}{{electedRe, began}, {endedRe, ended}} {
				m := x.re.FindStringSubmatch(line)
				if m == nil {
					continue
				}
				at, err := time.Parse(time.RFC3339Nano, m[1])
				term, err2 := strconv.ParseInt(m[2], 10, 64)
				if err != nil || err2 != nil {
					continue
				}
				// A leader that stepped down (a renewal failed) and renews
				// its own unexpired lease leads again at the same term:
				// one host per term is the rule, and the term began when
				// it was first elected and ended when it last stepped down.
				prev, seen := x.at[term]
				if !seen || (x.re == electedRe && at.Before(prev)) || (x.re == endedRe && at.After(prev)) {
					x.at[term] = at
				}
				if x.re == electedRe && !slices.Contains(elected[term], h.name) {
					elected[term] = append(elected[term], h.name)
				}
			}
		}
	}
	return elected, began, ended, stopTook
}

// ---- the invariants, at the end ----

// figures are what a scenario prints.
type figures struct {
	scenario     string
	tasks        int
	recover      time.Duration
	recoverWhat  string
	lost         int // submitted messages not done
	doubled      int // messages with more than one success report
	staleSuccess int // success reports under a claim that is not the message's final one
	lostReports  int // reports with status lost
	noReport     int // done messages without a success report
	unaccounted  int // attempts (claims counted on a message) without exactly one report
	dropped      int // reports the hosts' report writers said they did not store (their logs)
	maxRunning   int
	terms        int
	// overlap is, over every term that stepped down and every later term,
	// the latest its step-down came after the later term began: negative
	// when each deposed leader stopped before another led (overlapSeen
	// false when no term stepped down before a later one).
	overlap     time.Duration
	overlapSeen bool
	stopTook    time.Duration // longest a deposed leader's work took to return once told to stop
	extra       []string
}

func (f figures) String() string {
	overlap := "none"
	if f.overlapSeen {
		overlap = f.overlap.Round(time.Millisecond).String()
	}
	s := fmt.Sprintf("CHAOS %s: tasks=%d recover=%s (%s) lost=%d doubled=%d stale_success=%d lost_reports=%d done_without_report=%d unaccounted_attempts=%d reports_dropped=%d max_running_lim=%d/%d terms=%d beat_term_overlap=%s beat_stop_took=%s",
		f.scenario, f.tasks, f.recover.Round(10*time.Millisecond), f.recoverWhat, f.lost, f.doubled, f.staleSuccess, f.lostReports, f.noReport, f.unaccounted, f.dropped, f.maxRunning, topicLimit, f.terms, overlap, f.stopTook.Round(time.Millisecond))
	if len(f.extra) > 0 {
		s += " " + strings.Join(f.extra, " ")
	}
	return s
}

type report struct {
	msg     int64
	attempt int
	worker  string
	status  string
}

func reportsOf(t *testing.T, c *pgx.Conn, ids []int64) []report {
	t.Helper()
	rows, err := c.Query(context.Background(), `SELECT message_id, attempt, worker, status FROM tw_reports WHERE message_id = ANY($1) ORDER BY id`, ids)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (report, error) {
		var x report
		return x, r.Scan(&x.msg, &x.attempt, &x.worker, &x.status)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// explain describes message id for a failure: its row, its reports and
// the hosts' log lines that name it.
func explain(hs []*host, c *pgx.Conn, id int64) string {
	var b strings.Builder
	var state, claimedBy string
	var attempts int
	var claimedAt, finishedAt *time.Time
	_ = c.QueryRow(context.Background(), `SELECT state, coalesce(claimed_by, ''), attempts, claimed_at, finished_at FROM tw_messages_all WHERE id = $1`, id).
		Scan(&state, &claimedBy, &attempts, &claimedAt, &finishedAt)
	fmt.Fprintf(&b, "message %d: %s, claimed by %s at %v, attempts %d, finished %v\n", id, state, claimedBy, claimedAt, attempts, finishedAt)
	rows, err := c.Query(context.Background(), `SELECT attempt, worker, status, started_at, ended_at, error FROM tw_reports WHERE message_id = $1 ORDER BY id`, id)
	if err == nil {
		for rows.Next() {
			var attempt int
			var worker, status, errText string
			var started, ended time.Time
			if rows.Scan(&attempt, &worker, &status, &started, &ended, &errText) == nil {
				fmt.Fprintf(&b, "  report: attempt %d by %s %s, %s to %s %s\n", attempt, worker, status, started.Format("15:04:05.000"), ended.Format("15:04:05.000"), errText)
			}
		}
		rows.Close()
	}
	re := regexp.MustCompile(fmt.Sprintf(`\bmessage_id=%d\b|\bfirst_message_id=%d\b|ids="\[[^]]*\b%d\b`, id, id, id))
	for _, h := range hs {
		data, _ := os.ReadFile(h.logPath)
		for _, line := range strings.Split(string(data), "\n") {
			if re.MatchString(line) {
				fmt.Fprintf(&b, "  %s: %s\n", h.name, line)
			}
		}
	}
	return b.String()
}

// check asserts the invariants on ids once every one has ended, and fills f.
func check(t *testing.T, hs []*host, c *pgx.Conn, ids []int64, s *sampler, f *figures) {
	t.Helper()
	s.stop()
	// Reports are written after the outcome, off the workers' path: give
	// the last ones time to land (at most 30 s) before they are counted.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var missing int
		err := c.QueryRow(context.Background(), `SELECT count(*) FROM tw_messages_all m WHERE m.id = ANY($1) AND m.state = 'done'
			AND NOT EXISTS (SELECT 1 FROM tw_reports r WHERE r.message_id = m.id AND r.attempt = m.attempts AND r.worker = m.claimed_by)`, ids).Scan(&missing)
		if err == nil && missing == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	var droppedLines []string
	for _, h := range hs {
		b, _ := os.ReadFile(h.logPath)
		for _, line := range strings.Split(string(b), "\n") {
			if m := droppedRe.FindStringSubmatch(line); m != nil {
				n, _ := strconv.Atoi(m[1])
				f.dropped += n
				droppedLines = append(droppedLines, h.name+": "+line)
			}
		}
	}
	elected, began, ended, stopTook := termsFromLogs(hs)
	f.stopTook = stopTook
	var twice []string
	for term, by := range elected {
		if len(by) > 1 {
			twice = append(twice, fmt.Sprintf("term %d elected on %v", term, by))
		}
	}
	var overlapping []string
	for term, end := range ended {
		for later, start := range began {
			if later <= term {
				continue
			}
			if d := end.Sub(start); !f.overlapSeen || d > f.overlap {
				f.overlap, f.overlapSeen = d, true
			}
			if !end.Before(start) {
				overlapping = append(overlapping, fmt.Sprintf("term %d stepped down at %s, %s after term %d began",
					term, end.Format("15:04:05.000"), end.Sub(start).Round(time.Millisecond), later))
			}
		}
	}
	sort.Strings(overlapping)
	f.tasks = len(ids)
	type final struct {
		state, claimedBy string
		attempts         int
	}
	finals := map[int64]final{}
	rows, err := c.Query(context.Background(), `SELECT id, state, coalesce(claimed_by, ''), attempts FROM tw_messages_all WHERE id = ANY($1)`, ids)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		var m final
		if err := rows.Scan(&id, &m.state, &m.claimedBy, &m.attempts); err != nil {
			t.Fatal(err)
		}
		finals[id] = m
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var notDone []string
	for _, id := range ids {
		m, ok := finals[id]
		if !ok || m.state != "done" {
			f.lost++
			if len(notDone) < 20 {
				notDone = append(notDone, fmt.Sprintf("%d: %+v (found %v)", id, m, ok))
			}
		}
	}
	successes := map[int64]int{}
	perAttempt := map[int64]map[int]int{}
	var stale []string
	for _, r := range reportsOf(t, c, ids) {
		if perAttempt[r.msg] == nil {
			perAttempt[r.msg] = map[int]int{}
		}
		perAttempt[r.msg][r.attempt]++
		switch r.status {
		case "success":
			successes[r.msg]++
			m := finals[r.msg]
			if r.worker != m.claimedBy || r.attempt != m.attempts {
				f.staleSuccess++
				if len(stale) < 20 {
					stale = append(stale, fmt.Sprintf("message %d: success by %s at attempt %d, but its claim is %s at attempt %d", r.msg, r.worker, r.attempt, m.claimedBy, m.attempts))
				}
			}
		case "lost":
			f.lostReports++
		}
	}
	// Every attempt a message counts ran under a claim, and no process
	// dies in these scenarios: each one has exactly one report, lost when
	// its claim was taken back.
	var unaccounted, noReport, doubled []string
	for _, id := range ids {
		m := finals[id]
		for a := 1; a <= m.attempts; a++ {
			if n := perAttempt[id][a]; n != 1 {
				f.unaccounted++
				if len(unaccounted) < 20 {
					unaccounted = append(unaccounted, fmt.Sprintf("message %d attempt %d of %d: %d reports", id, a, m.attempts, n))
				}
			}
		}
		for a := range perAttempt[id] {
			if a < 1 || a > m.attempts {
				f.unaccounted++
				unaccounted = append(unaccounted, fmt.Sprintf("message %d: a report of attempt %d, but it counts %d", id, a, m.attempts))
			}
		}
		if successes[id] > 1 {
			f.doubled++
			if len(doubled) < 10 {
				doubled = append(doubled, explain(hs, c, id))
			}
		}
		if finals[id].state == "done" && successes[id] == 0 {
			f.noReport++
			if len(noReport) < 10 {
				noReport = append(noReport, explain(hs, c, id))
			}
		}
	}
	s.mu.Lock()
	f.maxRunning = s.maxRunning
	overLimit := s.overLimit
	dbSamples := s.dbSamples
	s.mu.Unlock()
	terms, bad := s.leaderViolations()
	f.terms = terms

	fmt.Println(f.String())
	t.Log(f.String())
	if f.lost > 0 {
		t.Errorf("%d of %d messages did not end done: %v", f.lost, len(ids), notDone)
	}
	if f.doubled > 0 {
		t.Errorf("%d messages were recorded done (success) more than once:\n%s", f.doubled, strings.Join(doubled, "\n"))
	}
	if f.staleSuccess > 0 {
		t.Errorf("%d attempts ran under a claim that was not the current one and were recorded as success, not lost: %v", f.staleSuccess, stale)
	}
	if f.noReport > 0 {
		t.Errorf("%d messages are done without a success report:\n%s", f.noReport, strings.Join(noReport, "\n"))
	}
	if len(droppedLines) > 0 {
		t.Errorf("the report writers dropped %d reports (worker/reports.go, ReportWriter.write gives up after 4 tries, about 1.2 s, of a database that does not answer):\n%s",
			f.dropped, strings.Join(droppedLines, "\n"))
	}
	if f.unaccounted > 0 {
		t.Errorf("%d attempts are not accounted for by exactly one report (a run under a claim that ended without being recorded): %v", f.unaccounted, unaccounted)
	}
	if len(overLimit) > 0 {
		t.Errorf("topic lim ran more than its limit of %d: %v", topicLimit, overLimit)
	}
	if dbSamples < 10 {
		t.Errorf("only %d samples of the running count", dbSamples)
	}
	if len(bad) > 0 {
		t.Errorf("leadership: %v", bad)
	}
	if len(twice) > 0 {
		t.Errorf("a term with two leaders (hosts' logs): %v", twice)
	}
	if len(overlapping) > 0 {
		t.Errorf("a deposed leader's beat went on after a later term began (it must stop before its lease can be taken; hosts' logs): %v", overlapping)
	}
	if terms == 0 {
		t.Errorf("no host ever said it leads the beat")
	}
}
