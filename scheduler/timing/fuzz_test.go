package timing

import (
	"strings"
	"testing"
	"time"
)

// FuzzParse: any interval and cron text either parses, into a timing
// whose next slots move forward in time, or is refused with an error that
// says why; nothing panics, and nothing hangs on an expression that
// never matches (such as February 30th).
func FuzzParse(f *testing.F) {
	for _, seed := range []struct {
		interval int
		expr     string
	}{
		{60, ""}, {0, "*/5 * * * *"}, {0, "0 0 30 2 *"}, {0, "0 0 31 4,6,9,11 *"}, {1, "* * * * *"},
		{0, "@every 1s"}, {0, "60 * * * *"}, {0, "* * * *"}, {-1, ""}, {0, "0-59/0 * * * *"}, {0, "\x00"},
	} {
		f.Add(seed.interval, seed.expr)
	}
	from := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, interval int, expr string) {
		tm, err := Parse(interval, expr)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("Parse(%d, %q) refused with an empty error", interval, expr)
			}
			return
		}
		next := tm.Next(from)
		if next.IsZero() {
			return // a cron that never matches: no slot, and no hang
		}
		if !next.After(from) {
			t.Fatalf("Parse(%d, %q): next slot %v is not after %v", interval, expr, next, from)
		}
		if again := tm.Next(next); !again.IsZero() && !again.After(next) {
			t.Fatalf("Parse(%d, %q): slot %v is followed by %v", interval, expr, next, again)
		}
		_ = tm.Period(from)
		if tm.String() == "" {
			t.Fatalf("Parse(%d, %q): an empty description", interval, expr)
		}
	})
}
