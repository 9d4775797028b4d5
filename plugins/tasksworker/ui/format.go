package ui

// Template helpers: times, durations, JSON and clipped text.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

func uiTimeOf(v any) (time.Time, bool) {
	switch t := v.(type) {
	case time.Time:
		return t, !t.IsZero()
	case *time.Time:
		if t == nil {
			return time.Time{}, false
		}
		return *t, !t.IsZero()
	}
	return time.Time{}, false
}

// uiWhen formats a time (or *time.Time) in UTC; "—" for none.
func uiWhen(v any) string {
	t, ok := uiTimeOf(v)
	if !ok {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

// uiRel says how long ago (or in how long) a time is; "—" for none.
func uiRel(v any) string {
	t, ok := uiTimeOf(v)
	if !ok {
		return "—"
	}
	d := time.Until(t)
	switch {
	case d > time.Second:
		return "in " + uiDuration(d)
	case d > -time.Second:
		return "just now"
	}
	return uiDuration(-d) + " ago"
}

// uiDuration is a short, rounded duration: 45s, 3m 05s, 2h 03m, 3d 4h.
func uiDuration(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Second:
		if d == 0 {
			return "0s"
		}
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return uiUnits(int(d.Minutes()), "m", int(d.Seconds())%60, "s")
	case d < 48*time.Hour:
		return uiUnits(int(d.Hours()), "h", int(d.Minutes())%60, "m")
	}
	return uiUnits(int(d.Hours())/24, "d", int(d.Hours())%24, "h")
}

// uiUnits prints "3m 05s", or "3m" when the second unit is zero.
func uiUnits(a int, au string, b int, bu string) string {
	if b == 0 {
		return fmt.Sprintf("%d%s", a, au)
	}
	return fmt.Sprintf("%d%s %02d%s", a, au, b, bu)
}

// uiPrettyJSON indents JSON for reading; anything else comes back as is.
func uiPrettyJSON(v any) string {
	var raw []byte
	switch b := v.(type) {
	case json.RawMessage:
		raw = b
	case []byte:
		raw = b
	case string:
		raw = []byte(b)
	default:
		return fmt.Sprint(v)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return ""
	}
	var out bytes.Buffer
	if json.Indent(&out, raw, "", "  ") != nil {
		return string(raw)
	}
	return out.String()
}

// uiClip shortens s to n characters.
func uiClip(n int, s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
