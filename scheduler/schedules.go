package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/scheduler/timing"
)

// TaskLookup tells the ticker whether a worker runs task, on topic when
// the schedule names one (this process or another live one), and the
// topic to submit to (the task's default when topic is empty). While it
// says no, the schedule waits for a worker: its due slot is held, not
// fired.
type TaskLookup func(task, topic string) (string, bool)

// Ticker fires due schedules. It runs on the beat leader only, and every
// fire is a fenced write: a deposed leader fires nothing.
//
// A pass reads the schedules due at its start from the store's due index
// (broker.ScheduleStore.DueSchedules), oldest first, in bounded batches,
// so its cost follows the number due, not the number of schedules.
//
// Late slots. A schedule whose due slot is more than a period old when a
// pass reaches it has missed slots; the pass fires only the latest due
// slot. Slots missed while no beat ran (before the first pass of this run
// of passes: a term's start, a pause or an outage of the store) follow
// the schedule's missed policy: skip records the latest slot without
// submitting, fire_once submits it once, late. Slots that came due while
// this beat ran, and were late only because the passes are slower than
// the schedule's period (many schedules, a slow database), are never
// skipped: the latest is submitted, late (catch-up). So a schedule is
// never skipped for ever because the beat is busy.
//
// Waiting for a worker. A due schedule whose task no live worker runs
// (Lookup says no) is not fired: nothing is submitted or stamped, and its
// due slot stays due, so it fires once a worker is live, as a slot the
// passes were late for (a slot missed while no beat ran follows the
// missed policy). A task provider that registers its tasks after the
// beat starts, or a host that is deployed again, loses no slot. Such a
// schedule is read by every pass until then; the health gauges leave it
// out of the overdue gauge (HealthCollector.Waiting) and count it in
// their own.
//
// Logs are summaries: one line per kind of event (late, skipped, waiting
// for a worker, invalid timing, failed fire) with its count and a few
// names, at most once per LogEvery; never a line per schedule per
// pass. The count is of schedules, not of passes: a schedule that waits
// through 60 passes between two lines is one schedule waiting, named
// once (see note).
type Ticker struct {
	Store  broker.ScheduleStore
	Lookup TaskLookup
	Logger hclog.Logger
	// Submitted, when set, is told of every message a fire submitted
	// (the task telemetry counts scheduled submissions too).
	Submitted func(topic string)
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// Batch is how many due schedules a pass reads at a time; default
	// broker.DefaultDueLimit.
	Batch int
	// LogEvery is the least time between two summary lines of a kind;
	// default one minute. The first line of a kind is written at once.
	LogEvery time.Duration

	mu sync.Mutex
	// term and since: the term and the start of the first pass of the
	// current run of passes (unbroken: each started within a gap of the
	// previous one's end, which read the due schedules). Slots due before
	// since were missed while no beat ran.
	term    int64
	since   time.Time
	lastEnd time.Time
	notes   map[string]*note
}

// note accumulates one kind of event between two summary lines. count is
// the number of distinct schedules that had the event since the last
// line, however many passes saw it (a waiting or invalid schedule is read
// by every pass); examples names the first maxExamples of them, each
// once. slots adds up the slots of every event, as each one is a fire (or
// a skip) of its own, so a schedule late at two passes adds its missed
// slots of both.
type note struct {
	count, slots int
	examples     []string
	seen         map[string]bool // the schedules counted, by name
	err          error
	logged       time.Time
	from         time.Time
}

// maxExamples bounds the schedule names a summary line quotes.
const maxExamples = 5

// defaultGap is the longest pause between two passes that still counts as
// the beat running, for the default tick of a second.
var defaultGap = gapFor(time.Second)

// gapFor is the longest pause between two passes that still counts as the
// beat running, for passes started every tick.
func gapFor(tick time.Duration) time.Duration { return 2*tick + 5*time.Second }

// Tick runs one pass: it fires every due, enabled schedule once. It
// returns ErrNotLeader when the lease moved on.
func (t *Ticker) Tick(ctx context.Context, fence broker.Fence) error {
	return t.pass(ctx, fence, defaultGap)
}

// pass is Tick for passes started at most gap after the previous one
// ended.
func (t *Ticker) pass(ctx context.Context, fence broker.Fence, gap time.Duration) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	log := t.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	now := t.now
	at := now().UTC()
	if fence.Term != t.term || t.lastEnd.IsZero() || at.Sub(t.lastEnd) > gap {
		t.term, t.since = fence.Term, at
	}
	t.lastEnd = time.Time{} // until this pass has read the due schedules
	defer func() { t.summarize(log, now()) }()

	f := broker.DueFilter{At: at, Limit: t.Batch}
	limit := broker.DueLimit(f)
	for {
		batch, err := t.Store.DueSchedules(ctx, f)
		if err != nil {
			return fmt.Errorf("due schedules: %w", err)
		}
		t.lastEnd = now().UTC()
		var reqs []broker.FireRequest
		for _, s := range batch {
			req, ok, err := t.plan(ctx, fence, s, at)
			if err != nil {
				return err
			}
			if ok {
				reqs = append(reqs, req)
			}
		}
		for chunk := range slices.Chunk(reqs, fireChunk) {
			if err := t.fireAll(ctx, chunk); err != nil {
				return err
			}
		}
		t.lastEnd = now().UTC()
		if len(batch) < limit {
			return nil
		}
		last := batch[len(batch)-1]
		if last.NextFireAt == nil { // a store that does not say: no further page
			return nil
		}
		f.AfterNext, f.AfterName = *last.NextFireAt, last.Name
	}
}

// fireChunk is how many fires go in one transaction (FireSchedules): one
// commit per chunk, not per schedule, and a transaction short enough not
// to hold the store's writers (SQLite has one) for long.
const fireChunk = 100

// plan returns the fire of schedule s, due by the pass's start at, or
// false when there is none: s is not due (a cron schedule that never
// fired is deferred to its first slot) or its timing is invalid. It
// returns only the errors that end the pass.
func (t *Ticker) plan(ctx context.Context, fence broker.Fence, s broker.Schedule, at time.Time) (broker.FireRequest, bool, error) {
	tm, err := timing.Parse(s.IntervalSeconds, s.Cron)
	if err != nil {
		t.add("invalid", s.Name, "", 0, err)
		return broker.FireRequest{}, false, nil
	}
	slot := timing.DueSlot(s, tm)
	if slot.After(at) {
		// A cron schedule that never fired: the store's index holds a
		// lower bound of its first slot; move it to the slot.
		if s.ExpectedNextRun == nil && !slot.IsZero() {
			if _, err := t.Store.DeferSchedule(ctx, s, slot); err != nil && ctx.Err() == nil {
				t.add("failed", s.Name, "", 0, err)
			}
		}
		return broker.FireRequest{}, false, ctx.Err()
	}
	topic, known := t.Lookup(s.Task, s.Topic)
	if s.Topic != "" {
		topic = s.Topic
	}
	if !known || topic == "" {
		// Held for a worker: see the type's comment.
		t.add("waiting", s.Name, "task "+s.Task, 0, nil)
		return broker.FireRequest{}, false, nil
	}
	latest, missed := tm.LatestDue(slot, at)
	next := tm.Next(latest)
	req := broker.FireRequest{Name: s.Name, Slot: latest, Next: next, Fence: &fence}
	// Slots that came due while this run of passes went on, after the
	// schedule's last change, were late because the passes are slow.
	busy := !slot.Before(t.since) && !slot.Before(s.UpdatedAt.UTC().Truncate(time.Second))
	submit := true
	switch {
	case missed > 0 && busy:
		t.add("late", s.Name, "", missed, nil)
	case missed > 0 && s.MissedPolicy == broker.MissedSkip:
		t.add("skipped", s.Name, "", missed+1, nil)
		submit = false
	case missed > 0:
		t.add("fire_once", s.Name, "", missed, nil)
	}
	if submit {
		payload := s.Payload
		if len(payload) == 0 {
			payload = json.RawMessage("{}")
		}
		req.Submit = &broker.SubmitRequest{Topic: topic, Task: s.Task, Payload: payload, UniqueKey: s.UniqueKey}
	}
	return req, true, nil
}

// fireAll fires reqs in one transaction; when that fails, one by one, so
// that one schedule that cannot fire does not hold the others back. It
// returns only the errors that end the pass.
func (t *Ticker) fireAll(ctx context.Context, reqs []broker.FireRequest) error {
	results, err := t.Store.FireSchedules(ctx, reqs)
	switch {
	case errors.Is(err, broker.ErrNotLeader):
		return err
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		for _, req := range reqs {
			res, err := t.Store.FireSchedule(ctx, req)
			switch {
			case errors.Is(err, broker.ErrNotLeader):
				return err
			case errors.Is(err, broker.ErrNotFound):
				// deleted meanwhile
			case err != nil && ctx.Err() != nil:
				return ctx.Err()
			case err != nil:
				t.add("failed", req.Name, "", 0, err)
			default:
				t.fired(req, res)
			}
		}
		return nil
	}
	for i, res := range results {
		t.fired(reqs[i], res)
	}
	return nil
}

// fired tells of a fire's submitted message.
func (t *Ticker) fired(req broker.FireRequest, res broker.FireResult) {
	if !res.Fired || res.MessageID == 0 || req.Submit == nil {
		return
	}
	if res.Duplicate {
		// The schedule's unique key is held: nothing was submitted.
		t.add("duplicate", req.Name, "key "+req.Submit.UniqueKey, 1, nil)
		return
	}
	if l := t.Logger; l != nil {
		l.Debug("schedule fired", "schedule", req.Name, "slot", req.Slot, "message_id", res.MessageID)
	}
	if t.Submitted != nil {
		t.Submitted(req.Submit.Topic)
	}
}

// now is the Ticker's clock: Now, else time.Now.
func (t *Ticker) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

// add records one event of kind for schedule name for the next summary
// line: the schedule counts once however many events it has (see note),
// and is named with detail in parentheses when detail is not empty.
func (t *Ticker) add(kind, name, detail string, slots int, err error) {
	if t.notes == nil {
		t.notes = map[string]*note{}
	}
	n := t.notes[kind]
	if n == nil {
		n = &note{}
		t.notes[kind] = n
	}
	if n.count == 0 {
		n.from = t.now()
	}
	n.slots += slots
	if !n.seen[name] {
		if n.seen == nil {
			n.seen = map[string]bool{}
		}
		n.seen[name] = true
		n.count++
		if len(n.examples) < maxExamples {
			example := name
			if detail != "" {
				example += " (" + detail + ")"
			}
			n.examples = append(n.examples, example)
		}
	}
	if n.err == nil {
		n.err = err
	}
}

// summaries are the summary lines, by kind.
var summaries = map[string]struct {
	level hclog.Level
	msg   string
}{
	"late":      {hclog.Warn, "schedules fired late: the beat's passes are slower than their periods; each fired its latest due slot"},
	"skipped":   {hclog.Warn, "schedules missed slots while no beat ran; skipping them"},
	"fire_once": {hclog.Warn, "schedules missed slots while no beat ran; firing once late"},
	"waiting":   {hclog.Warn, "schedules wait for a live worker that runs their task; their due slot fires once one is (see the schedule's waiting status)"},
	"invalid":   {hclog.Error, "schedules have an invalid timing; they do not fire"},
	"failed":    {hclog.Error, "schedules could not fire"},
	"duplicate": {hclog.Info, "schedules fired while the task of an earlier fire still held their unique key; nothing submitted"},
}

// summarize writes the summary line of every kind that has events and
// whose last line is at least LogEvery old.
func (t *Ticker) summarize(log hclog.Logger, now time.Time) {
	every := t.LogEvery
	if every <= 0 {
		every = time.Minute
	}
	for kind, n := range t.notes {
		if n.count == 0 || (!n.logged.IsZero() && now.Sub(n.logged) < every) {
			continue
		}
		args := []any{"count", n.count, "examples", strings.Join(n.examples, ", ")}
		if n.slots > 0 {
			args = append(args, "slots", n.slots)
		}
		if n.err != nil {
			args = append(args, "error", n.err)
		}
		if !n.logged.IsZero() {
			args = append(args, "since", n.from.UTC().Format(time.RFC3339))
		}
		sm := summaries[kind]
		log.Log(sm.level, sm.msg, args...)
		*n = note{logged: now}
	}
}

// HealthCollector exports the schedule health gauges at scrape time, from
// the stored schedules.
type HealthCollector struct {
	Store func() broker.ScheduleStore // nil result: nothing to export
	// Waiting, when set, says whether an enabled schedule waits for a
	// live worker that runs its task (the beat holds its slot): such a
	// schedule is left out of the overdue gauge, which answers "is the
	// beat beating?", and counted in the waiting gauge.
	Waiting func(broker.Schedule) bool
	Logger  hclog.Logger
	Now     func() time.Time
}

var (
	overdueDesc = prometheus.NewDesc("fastpluggy_schedule_overdue_seconds",
		"Worst lateness across enabled schedules: the age of the oldest due slot not yet fired (expected_next_run, "+
			"or the first slot of a schedule that never fired). The beat stamps a slot fired before the submit: "+
			"it answers \"is the beat beating?\", not \"is the task running?\".", nil, nil)
	waitingDesc = prometheus.NewDesc("fastpluggy_schedules_waiting",
		"Enabled schedules that wait for a live worker that runs their task on their topic: the beat holds their due slot "+
			"(left out of fastpluggy_schedule_overdue_seconds) until one is live. Above 0 for long: a provider plugin or host is down, "+
			"or a schedule names a task nothing registers.", nil, nil)
	sinceSuccessDesc = prometheus.NewDesc("fastpluggy_scheduled_task_since_success_seconds",
		"Seconds since the schedule of this task last produced a successful report (the report status, not the payload). "+
			"No series until the first success.", []string{"task"}, nil)
	intervalDesc = prometheus.NewDesc("fastpluggy_scheduled_task_interval_seconds",
		"The period the schedule of this task runs at (for cron, the gap between two successive occurrences).", []string{"task"}, nil)
)

// Describe implements prometheus.Collector.
func (c *HealthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- overdueDesc
	ch <- waitingDesc
	ch <- sinceSuccessDesc
	ch <- intervalDesc
}

// Collect implements prometheus.Collector. When several schedules run the
// same task, the task's series is that of the schedule worst off (highest
// since-success to interval ratio), so one label per task stays one series.
//
// The overdue gauge is the age of the oldest due slot that has not fired:
// over enabled schedules, now minus the due slot (the expected next run,
// or for a schedule that never fired its first slot) when that is past,
// else 0. A beat that keeps up holds it near its tick; one that is slow
// holds it near its pass time; a dead beat lets it grow.
func (c *HealthCollector) Collect(ch chan<- prometheus.Metric) {
	store := c.Store()
	if store == nil {
		return
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	scheds, err := store.ListSchedules(ctx)
	if err != nil {
		if c.Logger != nil {
			c.Logger.Warn("schedule gauges skipped: cannot list schedules", "error", err)
		}
		return
	}
	at := now().UTC()
	overdue, waiting := 0.0, 0
	type health struct{ since, period float64 }
	worst := map[string]health{}
	for _, s := range scheds {
		if !s.Enabled {
			continue
		}
		tm, err := timing.Parse(s.IntervalSeconds, s.Cron)
		if err != nil {
			continue
		}
		if c.Waiting != nil && c.Waiting(s) {
			waiting++
		} else if slot := timing.DueSlot(s, tm); !slot.IsZero() {
			overdue = max(overdue, at.Sub(slot).Seconds())
		}
		if s.LastSuccess == nil {
			continue // never succeeded: no series, by design
		}
		h := health{since: max(0, at.Sub(*s.LastSuccess).Seconds()), period: tm.Period(at).Seconds()}
		if old, ok := worst[s.Task]; !ok || h.since/h.period > old.since/old.period {
			worst[s.Task] = h
		}
	}
	ch <- prometheus.MustNewConstMetric(overdueDesc, prometheus.GaugeValue, overdue)
	ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(waiting))
	for task, h := range worst {
		ch <- prometheus.MustNewConstMetric(sinceSuccessDesc, prometheus.GaugeValue, h.since, task)
		ch <- prometheus.MustNewConstMetric(intervalDesc, prometheus.GaugeValue, h.period, task)
	}
}
