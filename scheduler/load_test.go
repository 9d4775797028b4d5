package scheduler

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/internal/testhost"
)

// scheduleBroker is what the load tests need of a broker: its schedules
// and its lease.
type scheduleBroker interface {
	broker.ScheduleStore
	broker.Leaser
}

// slowStore makes every fire take at least delay (a database under load,
// batched or not),
// so a pass over n due schedules takes at least n*delay, and counts the
// messages each schedule submitted.
type slowStore struct {
	broker.ScheduleStore
	delay time.Duration

	mu        sync.Mutex
	submitted map[string]int
}

func (s *slowStore) FireSchedule(ctx context.Context, req broker.FireRequest) (broker.FireResult, error) {
	time.Sleep(s.delay)
	res, err := s.ScheduleStore.FireSchedule(ctx, req)
	if err == nil && res.MessageID != 0 {
		s.mu.Lock()
		s.submitted[req.Name]++
		s.mu.Unlock()
	}
	return res, err
}

func (s *slowStore) FireSchedules(ctx context.Context, reqs []broker.FireRequest) ([]broker.FireResult, error) {
	time.Sleep(time.Duration(len(reqs)) * s.delay)
	out, err := s.ScheduleStore.FireSchedules(ctx, reqs)
	if err == nil {
		s.mu.Lock()
		for i, res := range out {
			if res.MessageID != 0 {
				s.submitted[reqs[i].Name]++
			}
		}
		s.mu.Unlock()
	}
	return out, err
}

// fewest returns the fewest messages any of the n schedules submitted, and
// the total.
func (s *slowStore) fewest(n int) (least, total int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	least = -1
	for i := range n {
		c := s.submitted[fmt.Sprintf("s%04d", i)]
		total += c
		if least < 0 || c < least {
			least = c
		}
	}
	return least, total
}

// logLines counts the log lines at level in logs.
func logLines(logs *testhost.SyncBuffer, level string) int {
	return strings.Count(logs.String(), "["+level+"]")
}

// runSlowPasses runs a beat over n schedules every second whose passes
// take longer than a second (every fire is slowed by delay), and waits
// until every schedule has submitted at least three messages. Before the
// fix, a schedule reached more than a second after its slot counted as
// having missed it "while no beat ran", was skipped, and was skipped
// again at every later pass: submitted stuck at the first pass's count.
func runSlowPasses(t *testing.T, b scheduleBroker, n int, delay time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range n {
		_, err := b.PutSchedule(ctx, broker.Schedule{Name: fmt.Sprintf("s%04d", i), Task: "t", Topic: "q", IntervalSeconds: 1, Enabled: true})
		if err != nil {
			t.Fatal(err)
		}
	}
	lease, held, err := b.TryLease(ctx, BeatLease, "h", time.Hour)
	if err != nil || !held {
		t.Fatalf("lease: %+v %v %v", lease, held, err)
	}
	fence := broker.Fence{Name: BeatLease, Holder: "h", Term: lease.Term}
	store := &slowStore{ScheduleStore: b, delay: delay, submitted: map[string]int{}}
	logs := &testhost.SyncBuffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})
	beat := &Beat{
		Schedules: &Ticker{Store: store, Logger: log, Lookup: func(task, topic string) (string, bool) { return "q", true }},
		TickEvery: time.Second,
		Logger:    log,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		beat.Run(ctx, fence)
	}()
	defer func() {
		cancel()
		<-done
	}()

	start := time.Now()
	deadline := start.Add(3 * time.Minute)
	last := -1
	lastGrowth := time.Now()
	for {
		least, total := store.fewest(n)
		if least >= 3 {
			break
		}
		if total > last {
			last, lastGrowth = total, time.Now()
		}
		if time.Now().After(deadline) || time.Since(lastGrowth) > 45*time.Second {
			out := logs.String()
			t.Log(out[:min(1500, len(out))])
			t.Fatalf("after %s: the schedule with the fewest submissions has %d (want 3), %d submitted in all, none for %s: schedules are skipped for ever",
				time.Since(start).Round(time.Second), least, total, time.Since(lastGrowth).Round(time.Second))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// One summary line per pass at most, never one per schedule.
	if w := logLines(logs, "WARN") + logLines(logs, "ERROR"); w > 20 {
		t.Errorf("%d WARN and ERROR lines for %d schedules over %s; want a few summaries", w, n, time.Since(start).Round(time.Second))
	}
}

func TestSlowPassesKeepFiringMemory(t *testing.T) {
	// 300 fires of 8 ms: a pass takes 2.4 s or more, for slots every second.
	runSlowPasses(t, memory.New(), 300, 8*time.Millisecond)
}

func TestSlowPassesKeepFiringPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := postgres.New(ctx, postgres.Options{DSN: testdb.DSN(), Schema: testdb.FreshSchema(t, "tw_sched_")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	runSlowPasses(t, b, 300, 7*time.Millisecond)
}

// The overdue gauge is the age of the oldest due slot that has not fired:
// a schedule that never fired, with no beat to fire it, is as overdue as
// its first slot is old. Before, such a schedule read 0.
func TestOverdueCountsNeverFiredSchedules(t *testing.T) {
	b := memory.New()
	ctx := context.Background()
	s, err := b.PutSchedule(ctx, broker.Schedule{Name: "a", Task: "t", Topic: "q", IntervalSeconds: 60, Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	at := s.UpdatedAt.Truncate(time.Second).Add(10 * time.Minute)
	got := overdue(t, &HealthCollector{Store: func() broker.ScheduleStore { return b }, Now: func() time.Time { return at }})
	if got != 600 {
		t.Fatalf("overdue = %v, want 600 (the first slot, never fired, is 10 minutes old)", got)
	}
}

// overdue collects c and returns its overdue gauge.
func overdue(t *testing.T, c *HealthCollector) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "fastpluggy_schedule_overdue_seconds" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no fastpluggy_schedule_overdue_seconds")
	return 0
}
