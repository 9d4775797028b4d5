package ui

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

// nested is value inside n levels of open ... close.
func nested(n int, open, value, close string) string {
	return strings.Repeat(open, n) + value + strings.Repeat(close, n)
}

// allocated is how many bytes f allocates, per run.
func allocated(runs int, f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(runs)
}

// Within its bounds the UI lays JSON out exactly as json.Indent does.
func TestUIIndentJSONIsJSONIndent(t *testing.T) {
	for _, in := range []string{
		`{}`, `[]`, `1`, `"s"`, ` 1 `, "\t{\"a\" : [ ] , \"b\":{ }}\n\n", `{"a": [1, 2, {"b": null}], "c": "x\"}\\"}`,
		`[[[[]]]]`, `{"html": "<b>&amp;</b>", "u": "\u00e9\u2028"}`, "[1,\n2]  \t", `{"a":{"b":{"c":[true,false]}}}`,
		nested(jsonMaxDepth-1, `{"k":`, `[1, 2]`, `}`),
		nested(jsonMaxDepth, `[`, `1`, `]`),
	} {
		var want bytes.Buffer
		if err := json.Indent(&want, []byte(in), "", "  "); err != nil {
			t.Fatalf("json.Indent(%q): %v", in, err)
		}
		got, why := indentJSON([]byte(in), 1<<20, jsonMaxDepth)
		if why != "" || string(got) != want.String() {
			t.Errorf("indentJSON(%q) = %q (%s), want %q", in, got, why, want.String())
		}
		if p := prettyJSON(json.RawMessage(in)); p != want.String() {
			t.Errorf("prettyJSON(%q) = %q, want %q", in, p, want.String())
		}
	}
	if got, why := indentJSON([]byte(`{"a":`), 1<<20, jsonMaxDepth); got != nil || why != notJSON {
		t.Errorf("indentJSON of broken JSON = %q, %q", got, why)
	}
}

// Deep or large stored JSON (older versions stored any depth) is shown as
// stored, cut when large, in memory bounded by the cut, not by the
// indented size (quadratic in the depth).
func TestUIJSONViewIsBounded(t *testing.T) {
	for _, c := range []struct {
		name, raw string
		cut       bool
		note      string
	}{
		{"20 KB nested 9,999 deep", nested(9999, `[`, `1`, `]`), false, "more than 100 levels deep"},
		{"60 KB nested 9,999 deep", nested(9999, `{"a":`, `1`, `}`), false, "more than 100 levels deep"},
		{"400 KB nested 20,000 deep", nested(20000, `{"abcdefghijklmno":`, `1`, `}`), true, "cut after 64 KB of 391 KB"},
		{"100 deep, 40 KB", nested(broker.MaxJSONDepth, `[`, strings.Repeat(`1,`, 20000)+`1`, `]`), false, "over 64 KB"},
		{"1 MB flat", `[` + strings.Repeat(`"abcdefgh",`, 100000) + `1]`, true, "cut after 64 KB of 1.0 MB: too large to show whole here."},
		{"1 MB not JSON", strings.Repeat(`é[`, 1<<18), true, "cut after 64 KB of 768 KB"},
		{"not JSON", `{"a": [}`, false, ""},
	} {
		var v jsonText
		raw := json.RawMessage(c.raw)
		got := allocated(3, func() { v = jsonView(raw, "payload", "/x", "x") })
		// The input's copy as a string, the cut text, and small change.
		if bound := uint64(min(len(c.raw), jsonMaxText) + 2*jsonMaxText + 64<<10); got > bound {
			t.Errorf("%s: jsonView allocates %d bytes, want at most %d", c.name, got, bound)
		}
		if v.Cut != c.cut || !strings.Contains(v.Note, c.note) || (c.note == "") != (v.Note == "") || len(v.Text) > jsonMaxText || !strings.HasPrefix(c.raw, v.Text) {
			t.Errorf("%s: cut %v, note %q, %d bytes shown", c.name, v.Cut, v.Note, len(v.Text))
		}
		if p := prettyJSON(json.RawMessage(c.raw)); p != c.raw {
			t.Errorf("%s: prettyJSON (for forms) did not give the stored text whole", c.name)
		}
	}
}

func BenchmarkUIJSONViewDeep(b *testing.B) {
	for name, raw := range map[string]string{
		"arrays-20KB":  nested(9999, `[`, `1`, `]`),
		"objects-60KB": nested(9999, `{"a":`, `1`, `}`),
	} {
		b.Run(name, func(b *testing.B) {
			data := json.RawMessage(raw)
			b.ReportAllocs()
			for b.Loop() {
				jsonView(data, "payload", "", "")
			}
		})
	}
}
