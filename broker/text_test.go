package broker

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
)

func TestCheckJSON(t *testing.T) {
	nul, _ := json.Marshal("a\x00b")
	for _, tc := range []struct {
		raw  string
		want string // "" for accepted, else a word of the error
	}{
		{`{"a":1}`, ""},
		{`"plain \n \" \\ \u00e9 \ud83d\ude00"`, ""},
		{`"\\u0000 is text, not an escape"`, ""},
		{`"ends with an escaped backslash \\"`, ""},
		{string(nul), "NUL"},
		{`{"k":"x\u0000"}`, "NUL"},
		{`["\ud83d"]`, "high surrogate"},
		{`["\ud83d\u0041"]`, "high surrogate"},
		{`"\ude00"`, "low surrogate"},
		{`{"a":`, "not valid JSON"},
		{`{"a":1} {"b":2}`, "not valid JSON"},
		{` [1, {"a": []}] `, ""},
		{nested(MaxJSONDepth, `[`, `1`, `]`), ""},
		{nested(MaxJSONDepth, `{"a":`, `1`, `}`), ""},
		{nested(MaxJSONDepth+1, `[`, `1`, `]`), "more than 100 levels deep"},
		{nested(MaxJSONDepth+1, `{"a":`, `1`, `}`), "more than 100 levels deep"},
		{nested(9999, `[`, ``, `]`), "more than 100 levels deep"},
		{nested(20000, `[`, ``, ``), "more than 100 levels deep"},
		{"\"\xff\"", "UTF-8"},
	} {
		err := CheckJSON([]byte(tc.raw))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckJSON(%s) = %v, want nil", tc.raw, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckJSON(%s) = %v, want an error about %s", tc.raw, err, tc.want)
		}
	}
}

// nested is value inside n levels of open ... close.
func nested(n int, open, value, close string) string {
	return strings.Repeat(open, n) + value + strings.Repeat(close, n)
}

// allocated is how many bytes f allocates, over runs runs.
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

// CheckJSON reads deep or large JSON in memory that does not grow with
// its size: deep JSON is refused at the limit, large JSON is streamed.
func TestCheckJSONMemory(t *testing.T) {
	for name, raw := range map[string][]byte{
		"9,999 deep arrays":  []byte(nested(9999, `[`, ``, `]`)),
		"9,999 deep objects": []byte(nested(9999, `{"abcdefghijklmnop":`, `1`, `}`)),
		"1 MB flat":          []byte(`[` + strings.Repeat(`{"k": "v\u00e9"},`, 1<<16) + `1]`),
		"100 deep, 1 MB":     []byte(nested(MaxJSONDepth, `[`, strings.Repeat(`1,`, 1<<19)+`1`, `]`)),
	} {
		var err error
		if got := allocated(5, func() { err = CheckJSON(raw) }); got > 64<<10 {
			t.Errorf("CheckJSON(%s, %d bytes) allocates %d bytes per call, want at most 64 KB", name, len(raw), got)
		}
		if deep := strings.Contains(name, "9,999"); deep != errors.Is(err, ErrTooDeep) {
			t.Errorf("CheckJSON(%s) = %v", name, err)
		}
	}
}

func TestCleanText(t *testing.T) {
	for in, want := range map[string]string{
		"fine":          "fine",
		"a\x00b":        "a\uFFFDb",
		"bad \xff byte": "bad \uFFFD byte",
		"":              "",
	} {
		if got := CleanText(in); got != want {
			t.Errorf("CleanText(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestValidateTopicName(t *testing.T) {
	for _, ok := range []string{"default", "a/b", "50%off", "café", "m#n", ".."} {
		if err := ValidateNewTopicName(ok); err != nil {
			t.Errorf("ValidateNewTopicName(%q) = %v, want nil", ok, err)
		}
	}
	// Names earlier versions stored stay valid where they are used.
	for _, old := range []string{" padded ", "caf\xe9"} {
		if err := ValidateTopicName(old); err != nil {
			t.Errorf("ValidateTopicName(%q) = %v, want nil", old, err)
		}
	}
	for topic, want := range map[string]string{
		"":                                 "empty",
		"caf\xe9":                          "not valid UTF-8",
		"a\x00b":                           "control character",
		"line\nbreak":                      "control character",
		" ":                                "white space",
		"padded ":                          "white space",
		strings.Repeat("x", MaxTopicLen+1): "limit",
	} {
		if err := ValidateNewTopicName(topic); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateNewTopicName(%q) = %v, want ErrInvalid saying %q", topic, err, want)
		}
	}
}

func BenchmarkCheckJSONDeep(b *testing.B) {
	for name, raw := range map[string]string{
		"arrays-20KB":  nested(9999, `[`, `1`, `]`),
		"objects-60KB": nested(9999, `{"a":`, `1`, `}`),
	} {
		b.Run(name, func(b *testing.B) {
			data := []byte(raw)
			b.ReportAllocs()
			for b.Loop() {
				_ = CheckJSON(data)
			}
		})
	}
}

// TestCheckJSONDepthPathsAgree: JSON with at most MaxJSONDepth brackets
// takes encoding/json's scanner, the rest the token reader; on text both
// can take, they agree. The texts are valid and broken JSON, and 20,000
// random edits of them (a fixed seed: the same every run).
func TestCheckJSONDepthPathsAgree(t *testing.T) {
	seeds := []string{
		`{"a":1}`, `[]`, `"x"`, ` 1 `, "\t\r\n1\n", `null`, `true`, `false`, `{"a":{"b":[1,2,{"c":null}]}}`,
		`{"a":1,"a":2}`, `"\u0000"`, `"\ud83d"`, "\"\xff\"", `{"a":`, `1 2`, `[1,]`, `1e400`, `-0.0e-0`,
		`"\/\b\f\n\r\t\""`, `{"a":[1,2.5e-3,-7,"s",{"t":[]}],"b":{}}`, `01`, `1.`, `.5`, `-`, `+1`, `"a`, `'a'`,
		`{"a" 1}`, `{,}`, `[1 2]`, `nul`, `NaN`, "\"\x01\"", `{"a":1}}`, `[[[]]]`, nested(MaxJSONDepth, `[`, ``, `]`),
		nested(MaxJSONDepth/2, `{"k":`, `[0]`, `}`), ``, ` `,
	}
	alphabet := []byte("{}[]\":,0123456789.eE+- \tatrufnl\\\x00\xff")
	rng := rand.New(rand.NewPCG(1, 2))
	inputs := make([][]byte, 0, 20_000+len(seeds))
	for _, s := range seeds {
		inputs = append(inputs, []byte(s))
	}
	for len(inputs) < cap(inputs) {
		b := []byte(seeds[rng.IntN(len(seeds))])
		for range 1 + rng.IntN(3) {
			switch i := rng.IntN(len(b) + 1); rng.IntN(3) {
			case 0: // insert
				b = append(b[:i], append([]byte{alphabet[rng.IntN(len(alphabet))]}, b[i:]...)...)
			case 1: // delete
				if i < len(b) {
					b = append(b[:i], b[i+1:]...)
				}
			default: // replace
				if i < len(b) {
					b[i] = alphabet[rng.IntN(len(alphabet))]
				}
			}
		}
		inputs = append(inputs, b)
	}
	checked := 0
	for _, raw := range inputs {
		if strings.Count(string(raw), "{")+strings.Count(string(raw), "[") > MaxJSONDepth {
			continue
		}
		checked++
		fast, slow := CheckJSONDepth(raw), checkDepthTokens(raw)
		if (fast == nil) != (slow == nil) {
			t.Fatalf("%q: the scanner's path says %v, the token reader's %v", raw, fast, slow)
		}
	}
	if checked < 19_000 {
		t.Fatalf("only %d inputs were checked on both paths", checked)
	}
}
