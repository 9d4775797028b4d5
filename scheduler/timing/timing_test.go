package timing

import (
	"strings"
	"testing"
	"time"
)

func TestCronPeriod(t *testing.T) {
	every5, err := Parse(0, "*/5 * * * *")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 30, 10, 2, 0, 0, time.UTC)
	if p := every5.Period(at); p != 300*time.Second {
		t.Fatalf("*/5 period = %s, want 300s", p)
	}
	weekdays, err := Parse(0, "0 9 * * 1-5")
	if err != nil {
		t.Fatal(err)
	}
	// Monday 10:00: the next two occurrences are Tuesday and Wednesday 9:00.
	if p := weekdays.Period(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)); p != 24*time.Hour {
		t.Fatalf("weekday period on Monday = %s, want 24h", p)
	}
	// Thursday 10:00: Friday 9:00, then Monday 9:00.
	if p := weekdays.Period(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)); p != 72*time.Hour {
		t.Fatalf("weekday period on Thursday = %s, want 72h", p)
	}
}

func TestParseErrorsSayWhichAndWhy(t *testing.T) {
	cases := []struct {
		interval int
		cron     string
		want     string
	}{
		{0, "", "give interval_seconds"},
		{60, "* * * * *", "not both"},
		{-5, "", "interval_seconds -5 is out of range"},
		{0, "* * * *", "has 4 fields; it needs 5"},
		{0, "*/5 * * * * *", "has 6 fields"},
		{0, "61 * * * *", `cron "61 * * * *" is not valid`},
		{0, "* * * * mon-fri-sat", "is not valid"},
		{0, "0 0 30 2 *", "never fires"},
	}
	for _, c := range cases {
		_, err := Parse(c.interval, c.cron)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%d, %q) = %v, want an error containing %q", c.interval, c.cron, err, c.want)
		}
	}
}

func TestLatestDue(t *testing.T) {
	tm, _ := Parse(60, "")
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	slot, missed := tm.LatestDue(start, start.Add(30*time.Second))
	if !slot.Equal(start) || missed != 0 {
		t.Fatalf("on time: %s %d", slot, missed)
	}
	slot, missed = tm.LatestDue(start, start.Add(185*time.Second))
	if !slot.Equal(start.Add(180*time.Second)) || missed != 3 {
		t.Fatalf("after downtime: %s %d", slot, missed)
	}
	cr, _ := Parse(0, "0 * * * *")
	slot, missed = cr.LatestDue(start, start.Add(150*time.Minute))
	if !slot.Equal(start.Add(2*time.Hour)) || missed != 2 {
		t.Fatalf("cron after downtime: %s %d", slot, missed)
	}
}

// After an outage longer than a walk over every slot would take (a
// minutely cron 100 days behind, 144,000 slots), LatestDue still finds the
// latest due slot, so a schedule fires once and not again at the next tick.
func TestLatestDueFarBehind(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		cron      string
		now, want time.Time
	}{
		{"* * * * *", start.Add(100*24*time.Hour + 30*time.Second), start.Add(100 * 24 * time.Hour)},
		{"*/5 * * * *", start.Add(400*24*time.Hour + 7*time.Minute), start.Add(400*24*time.Hour + 5*time.Minute)},
		{"0 9 * * 1-5", time.Date(2031, 3, 2, 12, 0, 0, 0, time.UTC), time.Date(2031, 2, 28, 9, 0, 0, 0, time.UTC)}, // a Sunday: the Friday before
	} {
		tm, err := Parse(0, c.cron)
		if err != nil {
			t.Fatal(err)
		}
		slot, missed := tm.LatestDue(start, c.now)
		if !slot.Equal(c.want) || missed < 1000 {
			t.Errorf("%s from %s to %s: latest due %s (missed %d), want %s (and over 1000 missed)", c.cron, start, c.now, slot, missed, c.want)
		}
		if next := tm.Next(slot); !next.After(c.now) {
			t.Errorf("%s: the slot after the latest due, %s, is not after now (%s)", c.cron, next, c.now)
		}
	}
}
