package tasksworker

// Duplicate and wrongly-cased keys in a JSON request body, which
// encoding/json would silently accept.

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
)

// duplicateKey returns where a key first appears twice in one object of
// the JSON value data ("task", or "payload.a.b"), or "" when none does.
// encoding/json keeps the last of duplicate keys and PostgreSQL's jsonb
// does the same, while the local store keeps the text as sent: a request
// that names its task twice would run the second, and a payload would read
// differently per store. data must be valid JSON.
func duplicateKey(data []byte) string {
	dup, _ := checkKeys(data, nil)
	return dup
}

// checkKeys walks data once and returns the first duplicate key (see
// duplicateKey) and, when names is not nil, the first key of the top-level
// object not spelled exactly as one of names (encoding/json matches keys
// without regard to case, so "Task" would fill task).
func checkKeys(data []byte, names []string) (dup, unknown string) {
	type frame struct {
		obj    bool
		keys   map[string]bool
		wantKy bool   // in an object, the next token is a key
		path   string // of this object or array
		key    string // the key whose value is being read
	}
	child := func(f *frame) string {
		switch {
		case f == nil:
			return ""
		case !f.obj:
			return f.path + "[]"
		case f.path == "":
			return f.key
		}
		return f.path + "." + f.key
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []*frame
	top := func() *frame {
		if len(stack) == 0 {
			return nil
		}
		return stack[len(stack)-1]
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", unknown
		}
		f := top()
		if f != nil && f.obj && f.wantKy {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				if p := top(); p != nil && p.obj {
					p.wantKy = true
				}
				continue
			}
			k, _ := tok.(string)
			if f.keys[k] {
				f.key = k
				return child(f), unknown
			}
			if names != nil && len(stack) == 1 && unknown == "" && !slices.Contains(names, k) {
				unknown = k
			}
			f.keys[k], f.key, f.wantKy = true, k, false
			continue
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{':
				stack = append(stack, &frame{obj: true, keys: map[string]bool{}, wantKy: true, path: child(f)})
				continue
			case '[':
				stack = append(stack, &frame{path: child(f)})
				continue
			case ']':
				stack = stack[:len(stack)-1]
				f = top()
			}
		}
		if f != nil && f.obj {
			f.wantKy = true
		}
	}
}

// jsonNames returns the JSON keys of the struct v points to, or nil when
// v is not a struct.
func jsonNames(v any) []string {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	names := []string{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
			continue
		case name == "":
			name = f.Name
		}
		names = append(names, name)
	}
	return names
}
