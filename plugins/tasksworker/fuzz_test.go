package tasksworker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

// FuzzDecodeBody: decodeBody (of a submit) accepts a body exactly when a
// reference decode does: encoding/json strictly into submitRequest, one
// value, no key twice in any object at any depth (refKeys), every
// top-level key spelled as a field, nested at most broker.MaxJSONDepth
// deep in a field. What it accepts decodes as the reference decodes it;
// what it refuses is a 400 with a message, naming the duplicate key when
// that is the one problem.
func FuzzDecodeBody(f *testing.F) {
	for _, s := range []string{
		submitExample, `{"task": "demo.echo"}`, `{"task": "a", "task": "b"}`, `{"Task": "a"}`, `{"task": "a", "extra": 1}`,
		`{"task": "a", "payload": {"x": {"y": [{"z": 1, "z": 2}]}}}`, `{"task": "a", "payload": {"a": 1, "\u0061": 2}}`,
		`{"task": "a"} {"task": "b"}`, `[]`, `"task"`, ``, `{"task": 1}`, `{"max_attempts": 1.5}`, `{"task": "a", "payload": [[[]]]}`,
		`{"payload": {"": 1, "": 2}}`, `{"payload": {"a.b": {"c": 1}, "a.b": 2}}`, `{"payload": ["\ud800", {"\udc00": 1, "\ud800": 2}]}`,
		`{"task": "a", "payload": ` + nestedJSON(broker.MaxJSONDepth, `[`, ``, `]`) + `}`,
		`{"task": "a", "payload": ` + nestedJSON(broker.MaxJSONDepth+1, `{"k":`, `1`, `}`) + `}`,
		nestedJSON(200, `[`, ``, `]`), "{\"task\": \"\xff\"}", "{\"payload\": {\"\xff\": 1, \"\xfe\": 2}}", `{"payload": {"a": 1, "a": 1}, "Task": "x"}`,
	} {
		f.Add([]byte(s))
	}
	names := jsonNames(&submitRequest{})
	f.Fuzz(func(t *testing.T, body []byte) {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/api/tasks", bytes.NewReader(body))
		var got submitRequest
		ok := decodeBody(w, r, 1<<20, &got, submitExample)

		var want submitRequest
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		decErr := dec.Decode(&want)
		if decErr == nil && dec.Decode(&struct{}{}) != io.EOF {
			decErr = io.ErrUnexpectedEOF
		}
		dup, unknown, depth := refKeys(body, names)
		wantOK := decErr == nil && dup == "" && unknown == "" && depth <= broker.MaxJSONDepth+1
		if ok != wantOK {
			t.Fatalf("decodeBody(%q) = %v (%s), but the reference says %v (decode: %v, dup %q, unknown %q, depth %d)",
				body, ok, w.Body, wantOK, decErr, dup, unknown, depth)
		}
		if ok {
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decodeBody(%q) gave %+v, the reference %+v", body, got, want)
			}
			return
		}
		var msg struct{ Error string }
		if w.Code != http.StatusBadRequest || json.Unmarshal(w.Body.Bytes(), &msg) != nil || msg.Error == "" {
			t.Fatalf("decodeBody(%q) refused with %d %s", body, w.Code, w.Body)
		}
		if decErr == nil && dup != "" && depth <= broker.MaxJSONDepth+1 && !strings.Contains(msg.Error, fmt.Sprintf("key %q appears twice", dup)) {
			t.Fatalf("decodeBody(%q) = %q, want the duplicate %q named", body, msg.Error, dup)
		}
	})
}

// refKeys is a reference for checkKeys, built on encoding/json's tokens
// with a set of keys per open object: the first duplicate key's path (as
// duplicateKey spells it), the first top-level key not among names, and
// the depth of the deepest array or object (0 for a scalar). It reads the
// first value of data; a syntax error ends it.
func refKeys(data []byte, names []string) (dup, unknown string, depth int) {
	type frame struct {
		obj  bool
		keys map[string]bool
		key  string
		// wantKey: in an object, the next token is a key
		wantKey bool
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []*frame
	path := func() string {
		var parts []string
		for i, f := range stack {
			switch {
			case !f.obj:
				parts = append(parts, "[]")
			case i == 0 || strings.Join(parts, "") == "":
				parts = append(parts, f.key)
			default:
				parts = append(parts, "."+f.key)
			}
		}
		return strings.Join(parts, "")
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return
		}
		if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].wantKey {
			if k, isKey := tok.(string); isKey {
				top := stack[n-1]
				top.key, top.wantKey = k, false
				if top.keys[k] && dup == "" {
					dup = path()
				}
				top.keys[k] = true
				if n == 1 && unknown == "" && !slices.Contains(names, k) {
					unknown = k
				}
				continue
			}
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			stack = append(stack, &frame{obj: tok == json.Delim('{'), keys: map[string]bool{}, wantKey: tok == json.Delim('{')})
			depth = max(depth, len(stack))
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) == 0 {
			return
		}
		if top := stack[len(stack)-1]; top.obj {
			top.wantKey = true
		}
	}
}
