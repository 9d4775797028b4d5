// Package timing is when a schedule fires: its interval or cron timing,
// its slots, and the next run of a stored schedule. The beat (package
// scheduler) fires schedules by it; the task service checks and shows
// them by it, without linking the beat.
package timing

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/taskhost/taskhost/broker"
)

// Bounds on an interval schedule.
const (
	MinInterval = time.Second
	MaxInterval = 366 * 24 * time.Hour
)

var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)

// Timing is when a schedule fires: a fixed interval, or a 5-field cron
// expression evaluated in UTC.
type Timing struct {
	interval time.Duration
	cron     cron.Schedule
	expr     string
}

// Parse checks and parses a schedule's timing. Exactly one of
// intervalSeconds and expr must be given. The error says which and why.
func Parse(intervalSeconds int, expr string) (Timing, error) {
	expr = strings.TrimSpace(expr)
	switch {
	case intervalSeconds != 0 && expr != "":
		return Timing{}, fmt.Errorf("give either interval_seconds or cron, not both")
	case intervalSeconds == 0 && expr == "":
		return Timing{}, fmt.Errorf("give interval_seconds (e.g. 60) or cron (e.g. \"*/5 * * * *\")")
	case expr == "":
		d := time.Duration(intervalSeconds) * time.Second
		if d < MinInterval || d > MaxInterval {
			return Timing{}, fmt.Errorf("interval_seconds %d is out of range: use 1 to %d", intervalSeconds, int(MaxInterval/time.Second))
		}
		return Timing{interval: d}, nil
	}
	if n := len(strings.Fields(expr)); n != 5 {
		return Timing{}, fmt.Errorf("cron %q has %d fields; it needs 5: minute hour day-of-month month day-of-week (UTC), e.g. \"*/5 * * * *\"", expr, n)
	}
	s, err := cronParser.Parse(expr)
	if err != nil {
		return Timing{}, fmt.Errorf("cron %q is not valid: %v", expr, err)
	}
	t := Timing{cron: s, expr: expr}
	// An expression that never fires (e.g. 30 February) is refused.
	if t.Next(time.Now().UTC()).IsZero() {
		return Timing{}, fmt.Errorf("cron %q never fires", expr)
	}
	return t, nil
}

// NextRun is when the beat fires s next: its expected next run once it has
// fired, else its first slot (its first cron time after it was stored, or
// at once for an interval). false for a timing that does not parse.
func NextRun(s broker.Schedule) (time.Time, bool) {
	tm, err := Parse(s.IntervalSeconds, s.Cron)
	if err != nil {
		return time.Time{}, false
	}
	return DueSlot(s, tm), true
}

// DueSlot is the due slot of s, whose timing is tm: the stored next run,
// or for a schedule that never fired, a slot derived from its stored
// update time, so that every leader computes the same slot.
func DueSlot(s broker.Schedule, tm Timing) time.Time {
	if s.ExpectedNextRun != nil {
		return s.ExpectedNextRun.UTC()
	}
	base := s.UpdatedAt.UTC().Truncate(time.Second)
	if tm.cron != nil {
		return tm.Next(base.Add(-time.Second))
	}
	return base
}

// Next is the first slot strictly after t.
func (tm Timing) Next(t time.Time) time.Time {
	if tm.cron != nil {
		return tm.cron.Next(t.UTC())
	}
	return t.Add(tm.interval)
}

// Period is the gap between two successive slots after t: the interval,
// or for cron the gap between the next two occurrences.
func (tm Timing) Period(t time.Time) time.Duration {
	if tm.cron == nil {
		return tm.interval
	}
	a := tm.Next(t)
	return tm.Next(a).Sub(a)
}

// String describes the timing.
func (tm Timing) String() string {
	if tm.cron != nil {
		return "cron " + tm.expr
	}
	return "every " + tm.interval.String()
}

// LatestDue walks from the due slot to the latest slot not after now. It
// returns that slot and how many slots before it were passed over.
func (tm Timing) LatestDue(slot, now time.Time) (time.Time, int) {
	if tm.cron == nil {
		n := int(now.Sub(slot) / tm.interval)
		return slot.Add(time.Duration(n) * tm.interval), n
	}
	missed := 0
	walk := func(steps int) bool { // true when slot is the latest due
		for range steps {
			next := tm.Next(slot)
			if next.After(now) || next.IsZero() {
				return true
			}
			slot = next
			missed++
		}
		return false
	}
	if walk(1000) {
		return slot, missed
	}
	// Far behind (a minutely schedule after a long outage): rather than
	// walk every slot, find one close before now, looking back twice as
	// far each time, and walk the few after it. missed then counts at
	// least the slots walked.
	for back := time.Minute; now.Add(-back).After(slot); back *= 2 {
		if n := tm.Next(now.Add(-back)); !n.IsZero() && !n.After(now) {
			slot = n
			missed++
			break
		}
	}
	walk(1 << 20)
	return slot, missed
}
