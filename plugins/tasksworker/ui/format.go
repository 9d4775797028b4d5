package ui

// Template helpers: times, durations, JSON and clipped text.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/taskhost/taskhost/broker"
)

func timeOf(v any) (time.Time, bool) {
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

// when formats a time (or *time.Time) in UTC; "—" for none.
func when(v any) string {
	t, ok := timeOf(v)
	if !ok {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

// rel says how long ago (or in how long) a time is; "—" for none.
func rel(v any) string {
	t, ok := timeOf(v)
	if !ok {
		return "—"
	}
	d := time.Until(t)
	switch {
	case d > time.Second:
		return "in " + duration(d)
	case d > -time.Second:
		return "just now"
	}
	return duration(-d) + " ago"
}

// duration is a short, rounded duration: 45s, 3m 05s, 2h 03m, 3d 4h.
func duration(d time.Duration) string {
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
		return units(int(d.Minutes()), "m", int(d.Seconds())%60, "s")
	case d < 48*time.Hour:
		return units(int(d.Hours()), "h", int(d.Minutes())%60, "m")
	}
	return units(int(d.Hours())/24, "d", int(d.Hours())%24, "h")
}

// units prints "3m 05s", or "3m" when the second unit is zero.
func units(a int, au string, b int, bu string) string {
	if b == 0 {
		return fmt.Sprintf("%d%s", a, au)
	}
	return fmt.Sprintf("%d%s %02d%s", a, au, b, bu)
}

// A page shows stored JSON within bounds: a value may be large, or, when
// an earlier version stored it, nested thousands deep, and an indented
// line is as long as its depth (a 20 KB value nested 10,000 deep is
// 200 MB indented). A value is indented only when it is valid JSON at
// most jsonMaxDepth deep whose indented text fits in jsonMaxText
// bytes; otherwise it is shown as stored, cut at jsonMaxText bytes,
// with a note.
const (
	jsonMaxText  = 64 << 10
	jsonMaxDepth = broker.MaxJSONDepth
)

// jsonText is a stored JSON value as a page shows it (the "json"
// template).
type jsonText struct {
	Text string // indented, or as stored (its first jsonMaxText bytes when Cut)
	Cut  bool
	Note string // why it is shown as stored; "" when it is indented (or not JSON)
	// The pre element's id, and where to read the whole value.
	ID, Link, LinkText string
}

// jsonOf returns raw as a page shows it (jsonText).
func jsonOf(raw []byte) jsonText {
	if len(bytes.TrimSpace(raw)) == 0 {
		return jsonText{}
	}
	out, why := indentJSON(raw, jsonMaxText, jsonMaxDepth)
	if why == "" {
		return jsonText{Text: string(out)}
	}
	switch {
	case len(raw) <= jsonMaxText && why == notJSON:
		return jsonText{Text: string(raw)}
	case len(raw) <= jsonMaxText:
		return jsonText{Text: string(raw), Note: "Shown as stored, not laid out: " + why + "."}
	}
	n := jsonMaxText
	for n > 0 && !utf8.RuneStart(raw[n]) {
		n--
	}
	return jsonText{Text: string(raw[:n]), Cut: true,
		Note: fmt.Sprintf("Shown as stored, cut after %s of %s: too large to show whole here.", byteSize(n), byteSize(len(raw)))}
}

// jsonView is the "json" template function: v (json.RawMessage, []byte
// or string) as a page shows it, in the pre element id, with a link to
// the whole value for when it is cut.
func jsonView(v any, id, link, linkText string) jsonText {
	var raw []byte
	switch b := v.(type) {
	case json.RawMessage:
		raw = b
	case []byte:
		raw = b
	case string:
		raw = []byte(b)
	default:
		raw = []byte(fmt.Sprint(v))
	}
	j := jsonOf(raw)
	j.ID, j.Link, j.LinkText = id, link, linkText
	return j
}

// prettyJSON is JSON for a form field: indented when it fits the bounds
// of jsonOf, else whole as stored (a form must hold all of it);
// anything else comes back as is.
func prettyJSON(v any) string {
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
	if out, why := indentJSON(raw, jsonMaxText, jsonMaxDepth); why == "" {
		return string(out)
	}
	return string(raw)
}

// notJSON is indentJSON's reason for text that is not JSON.
const notJSON = "it is not valid JSON"

// indentJSON returns raw indented as json.Indent(dst, raw, "", "  ")
// does, or why it does not: raw is not valid JSON, nests arrays and
// objects more than maxDepth deep (maxDepth is at most
// broker.MaxJSONDepth), or would be over maxOut bytes indented. It stops as soon as it knows, so it allocates at most about
// maxOut bytes whatever raw is.
func indentJSON(raw []byte, maxOut, maxDepth int) ([]byte, string) {
	tooLarge := fmt.Sprintf("laid out, it would be over %s", byteSize(maxOut))
	if len(raw) > maxOut {
		return nil, tooLarge
	}
	// Valid JSON at most broker.MaxJSONDepth deep, read in memory that
	// grows with that depth alone.
	switch err := broker.CheckJSONDepth(raw); {
	case errors.Is(err, broker.ErrTooDeep):
		return nil, fmt.Sprintf("it nests arrays and objects more than %d levels deep", min(maxDepth, broker.MaxJSONDepth))
	case err != nil:
		return nil, notJSON
	}
	out := make([]byte, 0, min(maxOut, 2*len(raw)+64))
	// As json.Indent: white space between tokens goes, and after the
	// value stays; an empty array or object stays {} or [].
	open, indent := 0, 0
	inString, escaped, ended, pending := false, false, false, false
	newline := func(depth int) {
		out = append(out, '\n')
		for range depth {
			out = append(out, ' ', ' ')
		}
	}
	for _, c := range raw {
		if len(out) > maxOut {
			return nil, tooLarge
		}
		if inString {
			out = append(out, c)
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
				ended = open == 0
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			if ended {
				out = append(out, c)
			}
			continue
		}
		if pending && c != '}' && c != ']' {
			pending = false
			indent++
			newline(indent)
		}
		switch c {
		case '"':
			inString = true
			out = append(out, c)
		case '{', '[':
			if open++; open > maxDepth {
				return nil, fmt.Sprintf("it nests arrays and objects more than %d levels deep", maxDepth)
			}
			pending = true
			out = append(out, c)
		case '}', ']':
			if pending {
				pending = false
			} else {
				indent--
				newline(indent)
			}
			out = append(out, c)
			open--
			ended = open == 0
		case ',':
			out = append(out, c)
			newline(indent)
		case ':':
			out = append(out, c, ' ')
		default:
			out = append(out, c)
			ended = open == 0
		}
	}
	if len(out) > maxOut {
		return nil, tooLarge
	}
	return out, ""
}

// byteSize is a size for people: 900 bytes, 64 KB, 1.5 MB.
func byteSize(n int) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	case n < 1<<20:
		return fmt.Sprintf("%.0f KB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
}

// clip shortens s to n characters.
func clip(n int, s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
