package ui

import (
	"bytes"
	"encoding/json"
	"errors"
	"html"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// jsonHTML is the "json" template's output: a pre element, then maybe a
// note with a link. Its texts must hold no markup ([^<>]) and its
// attributes no quote.
var jsonHTML = regexp.MustCompile(`^<pre(?: id="([^"<>]*)")?>([^<>]*)</pre>(?:<p class="hint json-note">([^<>]*)(?: The whole value: <a href="([^"<>]*)">([^<>]*)</a>\.)?</p>)?$`)

// FuzzUIJSONView: the UI's view of a stored JSON value never panics,
// shows at most jsonMaxText bytes (an indented line is at most
// 2*jsonMaxDepth+1 bytes longer than the text it lays out), renders as
// escaped HTML that gives back the text, and is json.Indent's layout when
// the value is valid JSON within the bounds, else a prefix of the stored
// text with a note (none for small text that is not JSON).
func FuzzUIJSONView(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `{"a": [1, 2, {"b": null}]}`, `"<script>alert(1)</script>"`, `{"html": "<b>&amp;</b>", "q": "'\""}`,
		"\x00", "\"\xff\xfe\"", `{"a":`, ` [ 1 , 2 ] `, "[1]\n\t ", `"\u003c/pre\u003e"`, `</pre><p>`,
		nested(jsonMaxDepth, `[`, `1`, `]`), nested(jsonMaxDepth+1, `[`, `1`, `]`), nested(9999, `{"a":`, `1`, `}`),
		`[` + strings.Repeat(`"abcdefgh",`, 8000) + `1]`, strings.Repeat("é", 40000),
	} {
		f.Add([]byte(s))
	}
	tmpl := pages["task"]
	f.Fuzz(func(t *testing.T, raw []byte) {
		v := jsonView(json.RawMessage(raw), "payload", "/ui/run?from=1", "the Run again form")
		if len(v.Text) > jsonMaxText || len(v.Text) > len(raw)*(2*jsonMaxDepth+3) {
			t.Fatalf("%d bytes in, %d bytes shown", len(raw), len(v.Text))
		}
		// The reference: json.Indent, within the bounds (beyond them it
		// takes memory quadratic in the depth).
		var want bytes.Buffer
		err := errOutOfBounds
		if len(raw) <= jsonMaxText && refDepth(raw) <= jsonMaxDepth {
			err = json.Indent(&want, raw, "", "  ")
		}
		switch {
		case len(bytes.TrimSpace(raw)) == 0:
			if v.Text != "" || v.Note != "" {
				t.Fatalf("blank %q shown as %q (%s)", raw, v.Text, v.Note)
			}
		case err == nil && want.Len() <= jsonMaxText:
			if v.Text != want.String() || v.Note != "" || v.Cut {
				t.Fatalf("%q shown as %q (%s), want json.Indent's %q", raw, v.Text, v.Note, want.String())
			}
		default:
			if !strings.HasPrefix(string(raw), v.Text) || v.Cut != (len(v.Text) < len(raw)) {
				t.Fatalf("%q shown as %q, cut %v, want a prefix", raw, v.Text, v.Cut)
			}
			small := len(raw) <= jsonMaxText
			switch {
			case err != nil && err != errOutOfBounds && small:
				// Not JSON: shown as it is, as before the bounds.
				if v.Note != "" {
					t.Fatalf("%q shown with note %q", raw, v.Note)
				}
			case err == errOutOfBounds && small && !json.Valid(raw) && refDepth(raw) <= 10000:
				// Not JSON, and deep: a note or not, whichever the
				// reader finds first.
			case v.Note == "":
				t.Fatalf("%q shown without a note", raw)
			}
		}

		var out bytes.Buffer
		if err := tmpl.ExecuteTemplate(&out, "json", v); err != nil {
			t.Fatal(err)
		}
		m := jsonHTML.FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("%q renders as %q, not the pre and note of the json template", raw, out.String())
		}
		// html/template writes U+FFFD for NUL and keeps other bytes.
		if got, want := html.UnescapeString(m[2]), strings.ReplaceAll(v.Text, "\x00", "\uFFFD"); got != want {
			t.Fatalf("%q renders as %q, which reads %q", raw, m[2], got)
		}
		if m[3] != "" && html.UnescapeString(m[3]) != v.Note {
			t.Fatalf("note %q renders as %q", v.Note, m[3])
		}
		if utf8.Valid(raw) && !utf8.ValidString(out.String()) {
			t.Fatalf("%q renders as invalid UTF-8", raw)
		}
	})
}

var errOutOfBounds = errors.New("out of the bounds")

// refDepth is how deeply raw nests arrays and objects, counting brackets
// outside strings.
func refDepth(raw []byte) int {
	depth, deepest := 0, 0
	inString, escaped := false, false
	for _, c := range raw {
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case inString && c == '"':
			inString = false
		case inString:
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}
