package memory

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/taskhost/taskhost/broker"
)

var _ broker.ScheduleStore = (*Broker)(nil)

// schedState holds the schedule store's data, behind b.mu.
type schedState struct {
	schedules map[string]*broker.Schedule
	// fires records the fired slots of each schedule (slot as unix
	// nanoseconds) and the message each one submitted (0 for none). A
	// schedule's fires go with it.
	fires map[string]map[int64]int64
	// reports by ascending id; the oldest are dropped past
	// DefaultReportRetain.
	reports  []broker.Report
	reportID int64
	// keys maps the keys of the stored reports that have one to their
	// ids.
	keys map[string]int64
	// due indexes the schedules DueSchedules may return.
	due dueIndex
}

// dueIndex holds the enabled schedules that have a NextFireAt, as a
// binary min-heap by (NextFireAt, Name): an update costs O(log n), and
// listing the due ones walks only them (a node not due has no due node
// below it).
type dueIndex struct {
	items []*broker.Schedule
	pos   map[string]int
}

func dueBefore(a, b *broker.Schedule) bool {
	if !a.NextFireAt.Equal(*b.NextFireAt) {
		return a.NextFireAt.Before(*b.NextFireAt)
	}
	return a.Name < b.Name
}

func (x *dueIndex) Len() int           { return len(x.items) }
func (x *dueIndex) Less(i, j int) bool { return dueBefore(x.items[i], x.items[j]) }
func (x *dueIndex) Swap(i, j int) {
	x.items[i], x.items[j] = x.items[j], x.items[i]
	x.pos[x.items[i].Name] = i
	x.pos[x.items[j].Name] = j
}
func (x *dueIndex) Push(v any) {
	s := v.(*broker.Schedule)
	x.pos[s.Name] = len(x.items)
	x.items = append(x.items, s)
}
func (x *dueIndex) Pop() any {
	s := x.items[len(x.items)-1]
	x.items[len(x.items)-1] = nil
	x.items = x.items[:len(x.items)-1]
	delete(x.pos, s.Name)
	return s
}

// remove drops the schedule named name, if indexed.
func (x *dueIndex) remove(name string) {
	if i, ok := x.pos[name]; ok {
		heap.Remove(x, i)
	}
}

// set indexes s (which replaces any schedule of its name) when it is
// enabled and has a NextFireAt, else drops it.
func (x *dueIndex) set(s *broker.Schedule) {
	if x.pos == nil {
		x.pos = make(map[string]int)
	}
	i, ok := x.pos[s.Name]
	switch {
	case !s.Enabled || s.NextFireAt == nil:
		x.remove(s.Name)
	case ok:
		x.items[i] = s
		heap.Fix(x, i)
	default:
		heap.Push(x, s)
	}
}

// list returns the schedules of f, in order.
func (x *dueIndex) list(f broker.DueFilter) []*broker.Schedule {
	var out []*broker.Schedule
	var walk func(i int)
	walk = func(i int) {
		if i >= len(x.items) || x.items[i].NextFireAt.After(f.At) {
			return
		}
		s := x.items[i]
		if f.AfterName == "" || s.NextFireAt.After(f.AfterNext) || (s.NextFireAt.Equal(f.AfterNext) && s.Name > f.AfterName) {
			out = append(out, s)
		}
		walk(2*i + 1)
		walk(2*i + 2)
	}
	walk(0)
	sort.Slice(out, func(i, j int) bool { return dueBefore(out[i], out[j]) })
	if n := broker.DueLimit(f); len(out) > n {
		out = out[:n]
	}
	return out
}

// st returns the schedule store's data, creating it; b.mu is held.
func (b *Broker) st() *schedState {
	if b.sched == nil {
		b.sched = &schedState{
			schedules: make(map[string]*broker.Schedule),
			fires:     make(map[string]map[int64]int64),
		}
	}
	return b.sched
}

// PutSchedule validates s (see broker.NormalizeSchedule) and creates or
// replaces the schedule named s.Name. A replaced schedule keeps its run
// state (LastAttempt, LastSuccess, ExpectedNextRun) and CreatedAt, except
// that ExpectedNextRun is cleared when IntervalSeconds or Cron changed.
// UpdatedAt (and CreatedAt on creation) is now. It returns the schedule as
// stored.
func (b *Broker) PutSchedule(ctx context.Context, s broker.Schedule) (broker.Schedule, error) {
	s, err := broker.NormalizeSchedule(s)
	if err != nil {
		return broker.Schedule{}, err
	}
	if err := b.begin(ctx); err != nil {
		return broker.Schedule{}, err
	}
	defer b.mu.Unlock()

	st := b.st()
	now := b.now()
	if old := st.schedules[s.Name]; old != nil {
		s.CreatedAt = old.CreatedAt
		s.LastAttempt, s.LastSuccess = old.LastAttempt, old.LastSuccess
		if old.IntervalSeconds == s.IntervalSeconds && old.Cron == s.Cron {
			s.ExpectedNextRun = old.ExpectedNextRun
		}
	} else {
		s.CreatedAt = now
	}
	s.UpdatedAt = now
	s.NextFireAt = s.ExpectedNextRun
	if s.NextFireAt == nil {
		first := now.Truncate(time.Second)
		s.NextFireAt = &first
	}
	st.schedules[s.Name] = &s
	st.due.set(&s)
	return copySchedule(&s), nil
}

// GetSchedule returns the schedule; broker.ErrNotFound when there is none.
func (b *Broker) GetSchedule(ctx context.Context, name string) (broker.Schedule, error) {
	if err := b.begin(ctx); err != nil {
		return broker.Schedule{}, err
	}
	defer b.mu.Unlock()

	s := b.st().schedules[name]
	if s == nil {
		return broker.Schedule{}, fmt.Errorf("schedule %q: %w", name, broker.ErrNotFound)
	}
	return copySchedule(s), nil
}

// ListSchedules returns every schedule, by name.
func (b *Broker) ListSchedules(ctx context.Context) ([]broker.Schedule, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	st := b.st()
	out := make([]broker.Schedule, 0, len(st.schedules))
	for _, s := range st.schedules {
		out = append(out, copySchedule(s))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// DeleteSchedule removes the schedule and its record of fired slots (a
// schedule created again under the name may fire those slots again); its
// reports stay. broker.ErrNotFound when there is none.
func (b *Broker) DeleteSchedule(ctx context.Context, name string) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	st := b.st()
	if st.schedules[name] == nil {
		return fmt.Errorf("schedule %q: %w", name, broker.ErrNotFound)
	}
	delete(st.schedules, name)
	delete(st.fires, name)
	st.due.remove(name)
	return nil
}

// DueSchedules returns the enabled schedules whose NextFireAt is not
// after f.At, by (NextFireAt, Name), after (f.AfterNext, f.AfterName)
// when AfterName is set, at most broker.DueLimit(f), from an index.
func (b *Broker) DueSchedules(ctx context.Context, f broker.DueFilter) ([]broker.Schedule, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	due := b.st().due.list(f)
	out := make([]broker.Schedule, len(due))
	for i, s := range due {
		out[i] = copySchedule(s)
	}
	return out, nil
}

// DeferSchedule moves a never-fired schedule's NextFireAt forward to
// until when it is unchanged since s was read (same UpdatedAt) and until
// is later; it reports whether it did.
func (b *Broker) DeferSchedule(ctx context.Context, s broker.Schedule, until time.Time) (bool, error) {
	if err := b.begin(ctx); err != nil {
		return false, err
	}
	defer b.mu.Unlock()

	st := b.st()
	cur := st.schedules[s.Name]
	if cur == nil || cur.ExpectedNextRun != nil || !cur.UpdatedAt.Equal(s.UpdatedAt) ||
		cur.NextFireAt == nil || !until.After(*cur.NextFireAt) {
		return false, nil
	}
	u := until
	cur.NextFireAt = &u
	st.due.set(cur)
	return true, nil
}

// FireSchedule fires slot req.Slot of schedule req.Name, at most once per
// (name, slot), all under the broker's lock:
//
//   - the request is checked first (broker.ValidateFire: a name, a slot,
//     and req.Submit as Submit would check it);
//   - with req.Fence, the lease must be held by Fence.Holder at Fence.Term
//     and not expired, or nothing changes and the error is
//     broker.ErrNotLeader;
//   - the schedule must exist (broker.ErrNotFound);
//   - a slot that already fired returns Fired false and changes nothing;
//   - otherwise the slot is recorded, LastAttempt becomes now and
//     ExpectedNextRun req.Next (cleared when Next is zero), and req.Submit,
//     when set, is submitted as Submit would with header "schedule" set to
//     the name (broker.FireSubmit); its id is recorded with the slot and
//     returned.
func (b *Broker) FireSchedule(ctx context.Context, req broker.FireRequest) (broker.FireResult, error) {
	if err := broker.ValidateFire(req); err != nil {
		return broker.FireResult{}, err
	}
	if err := b.begin(ctx); err != nil {
		return broker.FireResult{}, err
	}
	defer b.mu.Unlock()

	if err := b.fencedLocked(req.Fence); err != nil {
		return broker.FireResult{}, err
	}
	res := b.fireLocked(req)
	if res.Missing {
		return broker.FireResult{}, fmt.Errorf("schedule %q: %w", req.Name, broker.ErrNotFound)
	}
	return res, nil
}

// FireSchedules fires each request as FireSchedule does, all under the
// broker's lock; see broker.ScheduleStore.
func (b *Broker) FireSchedules(ctx context.Context, reqs []broker.FireRequest) ([]broker.FireResult, error) {
	fence, err := broker.ValidateFires(reqs)
	if err != nil {
		return nil, err
	}
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	if err := b.fencedLocked(fence); err != nil {
		return nil, err
	}
	out := make([]broker.FireResult, len(reqs))
	for i, req := range reqs {
		out[i] = b.fireLocked(req)
	}
	return out, nil
}

// fencedLocked checks a fire's fence; b.mu is held.
func (b *Broker) fencedLocked(f *broker.Fence) error {
	if f == nil {
		return nil
	}
	l := b.leases[f.Name]
	if l == nil || l.Holder != f.Holder || l.Term != f.Term || !l.ExpiresAt.After(b.now()) {
		return broker.ErrNotLeader
	}
	return nil
}

// fireLocked fires a checked request whose fence holds; b.mu is held.
func (b *Broker) fireLocked(req broker.FireRequest) broker.FireResult {
	now := b.now()
	st := b.st()
	s := st.schedules[req.Name]
	if s == nil {
		return broker.FireResult{Missing: true}
	}
	slot := req.Slot.UnixNano()
	fired := st.fires[req.Name]
	if _, ok := fired[slot]; ok {
		return broker.FireResult{Fired: false}
	}
	if fired == nil {
		fired = make(map[int64]int64)
		st.fires[req.Name] = fired
	}
	var (
		id  int64
		dup bool
	)
	if req.Submit != nil {
		id, dup = b.submitLocked(broker.FireSubmit(req))
	}
	fired[slot] = id
	attempt := now
	s.LastAttempt = &attempt
	s.ExpectedNextRun = nil
	if !req.Next.IsZero() {
		next := req.Next
		s.ExpectedNextRun = &next
	}
	s.NextFireAt = s.ExpectedNextRun
	st.due.set(s)
	return broker.FireResult{Fired: true, MessageID: id, Duplicate: dup}
}

func copySchedule(s *broker.Schedule) broker.Schedule {
	c := *s
	c.Payload = slices.Clone(s.Payload)
	for _, p := range []**time.Time{&c.LastAttempt, &c.LastSuccess, &c.ExpectedNextRun, &c.NextFireAt} {
		if *p != nil {
			t := **p
			*p = &t
		}
	}
	return c
}
