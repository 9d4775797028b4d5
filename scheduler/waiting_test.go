package scheduler

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/internal/testhost"
)

// A due schedule whose task no live worker runs waits for one: the passes
// neither submit nor stamp it, its slot stays due, and it fires once a
// worker runs the task. One summary line says so.
func TestWaitingScheduleHoldsItsSlot(t *testing.T) {
	b := memory.New()
	ctx := context.Background()
	s, err := b.PutSchedule(ctx, broker.Schedule{Name: "w", Task: "late", Topic: "q", IntervalSeconds: 3600, Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	tk, store, clock, fence := clockTicker(t, b)
	var live atomic.Bool
	tk.Lookup = func(task, topic string) (string, bool) { return topic, task != "late" || live.Load() }
	var log testhost.SyncBuffer
	tk.Logger = hclog.New(&hclog.LoggerOptions{Output: &log, Level: hclog.Debug})
	first := s.UpdatedAt.UTC().Truncate(time.Second)
	for i := range 5 {
		*clock = first.Add(time.Duration(i)*time.Second + 500*time.Millisecond)
		tick(t, tk, fence)
	}
	got, _ := b.GetSchedule(ctx, "w")
	if store.submitted["w"] != 0 || got.LastAttempt != nil || got.ExpectedNextRun != nil {
		t.Fatalf("while no worker runs the task: submitted %d, last attempt %v, next run %v; want nothing fired or stamped",
			store.submitted["w"], got.LastAttempt, got.ExpectedNextRun)
	}
	if due, _ := b.DueSchedules(ctx, broker.DueFilter{At: *clock}); len(due) != 1 {
		t.Fatalf("due: %d, want the waiting schedule still due", len(due))
	}
	if n := strings.Count(log.String(), "wait for a live worker"); n != 1 || !strings.Contains(log.String(), "w (task late)") {
		t.Errorf("%d summary lines about waiting schedules, want 1 naming it:\n%s", n, log.String())
	}

	live.Store(true)
	*clock = first.Add(5500 * time.Millisecond)
	tick(t, tk, fence)
	got, _ = b.GetSchedule(ctx, "w")
	if store.submitted["w"] != 1 || got.LastAttempt == nil || got.ExpectedNextRun == nil || !got.ExpectedNextRun.Equal(first.Add(time.Hour)) {
		t.Fatalf("once a worker runs it: submitted %d, next run %v; want the held slot fired and the next an hour after it",
			store.submitted["w"], got.ExpectedNextRun)
	}
}

// A waiting schedule is not the beat's lateness: the overdue gauge leaves
// it out and the waiting gauge counts it.
func TestWaitingSchedulesHaveTheirOwnGauge(t *testing.T) {
	b := memory.New()
	ctx := context.Background()
	var at time.Time
	for _, s := range []broker.Schedule{
		{Name: "ok", Task: "t", Topic: "q", IntervalSeconds: 60, Enabled: true},
		{Name: "w1", Task: "late", Topic: "q", IntervalSeconds: 60, Enabled: true},
		{Name: "w2", Task: "late", Topic: "q", Cron: "0 3 * * *", Enabled: true},
		{Name: "off", Task: "late", Topic: "q", IntervalSeconds: 60},
	} {
		stored, err := b.PutSchedule(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		at = stored.UpdatedAt.Truncate(time.Second).Add(2 * time.Minute)
	}
	c := &HealthCollector{Store: func() broker.ScheduleStore { return b }, Now: func() time.Time { return at },
		Waiting: func(s broker.Schedule) bool { return s.Task == "late" }}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
	}
	if got["fastpluggy_schedules_waiting"] != 2 {
		t.Errorf("waiting = %v, want 2 (the enabled schedules of the task no worker runs)", got["fastpluggy_schedules_waiting"])
	}
	if o := got["fastpluggy_schedule_overdue_seconds"]; o < 119 || o > 121 {
		t.Errorf("overdue = %v, want about 120 (schedule ok alone)", o)
	}
}

// The summary of waiting schedules counts schedules, not passes: two
// schedules that wait through a minute of passes are count=2, each named
// once, in every line; and the line is still written at most once a
// minute.
func TestWaitingSummaryCountsSchedules(t *testing.T) {
	b := memory.New()
	ctx := context.Background()
	var first time.Time
	for _, name := range []string{"a", "b"} {
		s, err := b.PutSchedule(ctx, broker.Schedule{Name: name, Task: "late", Topic: "q", IntervalSeconds: 3600, Enabled: true})
		if err != nil {
			t.Fatal(err)
		}
		first = s.UpdatedAt.UTC().Truncate(time.Second)
	}
	tk, _, clock, fence := clockTicker(t, b)
	tk.Lookup = func(task, topic string) (string, bool) { return topic, task != "late" }
	var log testhost.SyncBuffer
	tk.Logger = hclog.New(&hclog.LoggerOptions{Output: &log, Level: hclog.Debug})
	for i := range 125 { // a pass a second: lines at 0 s, 60 s and 120 s
		*clock = first.Add(time.Duration(i)*time.Second + 500*time.Millisecond)
		tick(t, tk, fence)
	}
	var lines []string
	for _, l := range strings.Split(log.String(), "\n") {
		if strings.Contains(l, "wait for a live worker") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 3 {
		t.Fatalf("%d summary lines about waiting schedules in 125 passes, want 3 (one a minute):\n%s", len(lines), log.String())
	}
	for i, l := range lines {
		if !strings.Contains(l, "count=2 ") || !strings.Contains(l, `examples="a (task late), b (task late)"`) {
			t.Errorf("want count=2 and each schedule named once:\n%s", l)
		}
		// A line after the first says since when it counts: the Ticker's
		// clock at the pass after the line before it, not the wall clock.
		if i == 0 {
			continue
		}
		since := first.Add(time.Duration(60*(i-1)+1)*time.Second + 500*time.Millisecond)
		if want := "since=" + since.Format(time.RFC3339); !strings.Contains(l, want) {
			t.Errorf("want %s:\n%s", want, l)
		}
	}
}

// Every kind of summary counts a schedule once between two lines, and
// adds up the slots of all its events: a schedule late at three passes
// is one schedule, its missed slots of all three.
func TestSummaryCountsEachScheduleOnce(t *testing.T) {
	var log testhost.SyncBuffer
	logger := hclog.New(&hclog.LoggerOptions{Output: &log, Level: hclog.Debug})
	tk := &Ticker{}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tk.summarize(logger, at) // nothing yet
	for range 3 {
		tk.add("late", "a", "", 2, nil)
		tk.add("failed", "a", "", 0, errors.New("boom"))
		tk.add("duplicate", "d", "key k", 1, nil)
	}
	tk.add("late", "b", "", 1, nil)
	tk.summarize(logger, at)
	out := log.String()
	for _, want := range []string{
		`schedules fired late: the beat's passes are slower than their periods; each fired its latest due slot: count=2 examples="a, b" slots=7`,
		`schedules could not fire: count=1 examples=a error=boom`,
		`nothing submitted: count=1 examples="d (key k)" slots=3`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}
