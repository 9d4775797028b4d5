package tasksworker

import (
	"strings"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

func TestDuplicateKey(t *testing.T) {
	for in, want := range map[string]string{
		`{}`:                               "",
		`{"a": 1, "b": {"a": 2}}`:          "",
		`[{"a": 1}, {"a": 2}]`:             "",
		`{"a": [1, {"b": [], "c": {}}]}`:   "",
		`{"a": 1, "a": 1}`:                 "a",
		`{"x": {"y": [{"z": 1, "z": 2}]}}`: "x.y[].z",
		`{"x": {}, "y": 1, "y": 2}`:        "y",
		`"a"`:                              "",
	} {
		if got := duplicateKey([]byte(in)); got != want {
			t.Errorf("duplicateKey(%s) = %q, want %q", in, got, want)
		}
	}
}

// deepBodies are request bodies whose payload nests 9,999 deep, as a
// hostile client sent them: 20 KB of arrays, and 450 KB of objects with
// 40-byte keys (a full key path per level was 2 GB).
var deepBodies = map[string]string{
	"arrays-20KB":   `{"task": "demo.echo", "payload": ` + nestedJSON(9999, `[`, ``, `]`) + `}`,
	"objects-450KB": `{"task": "demo.echo", "payload": ` + nestedJSON(9999, `{"`+strings.Repeat("k", 40)+`":`, `1`, `}`) + `}`,
}

func TestCheckKeysStopsAtTheDepthLimit(t *testing.T) {
	names := jsonNames(&submitRequest{})
	for name, body := range deepBodies {
		var kc keyCheck
		data := []byte(body)
		if got := bytesAllocated(3, func() { kc = checkKeys(data, names, broker.MaxJSONDepth+1) }); got > 64<<10 {
			t.Errorf("%s: checkKeys allocated %d bytes, want at most 64 KB", name, got)
		}
		if !kc.tooDeep || kc.field != "payload" {
			t.Errorf("%s: checkKeys = %+v, want too deep in payload", name, kc)
		}
	}
	at := `{"task": "demo.echo", "payload": ` + nestedJSON(broker.MaxJSONDepth, `{"a":`, `1`, `}`) + `, "task": 1}`
	if kc := checkKeys([]byte(at), names, broker.MaxJSONDepth+1); kc.tooDeep || kc.dup != "task" {
		t.Errorf("checkKeys at the depth limit = %+v, want the duplicate task", kc)
	}
	// Without a limit, memory grows with the input, not its square (a
	// frame, a key and jsontext's names of each open object).
	body := []byte(deepBodies["objects-450KB"])
	if got := bytesAllocated(1, func() { checkKeys(body, names, 0) }); got > 16*uint64(len(body)) {
		t.Errorf("checkKeys without a depth limit allocated %d bytes for %d bytes of JSON", got, len(body))
	}
}

func BenchmarkCheckKeysDeep(b *testing.B) {
	names := jsonNames(&submitRequest{})
	for name, body := range deepBodies {
		b.Run(name, func(b *testing.B) {
			data := []byte(body)
			b.ReportAllocs()
			for b.Loop() {
				checkKeys(data, names, broker.MaxJSONDepth+1)
			}
		})
	}
}
