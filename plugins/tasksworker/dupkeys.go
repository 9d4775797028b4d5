package tasksworker

// Duplicate and wrongly-cased keys in a JSON request body, which
// encoding/json would silently accept, and nesting beyond the limit.

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"
)

// duplicateKey returns where a key first appears twice in one object of
// the JSON value data ("task", or "payload.a.b"), or "" when none does.
// encoding/json keeps the last of duplicate keys and PostgreSQL's jsonb
// does the same, while the local store keeps the text as sent: a request
// that names its task twice would run the second, and a payload would read
// differently per store. data must be valid JSON.
func duplicateKey(data []byte) string {
	return checkKeys(data, nil, 0).dup
}

// keyCheck is what checkKeys finds.
type keyCheck struct {
	// dup is where a key first appears twice in one object (see
	// duplicateKey), "" when none does.
	dup string
	// unknown is the first key of the top-level object not spelled
	// exactly as one of the names checkKeys was given.
	unknown string
	// tooDeep: arrays and objects nest deeper than the limit, in the
	// value of the top-level object's key field ("" when the top level
	// is not an object).
	tooDeep bool
	field   string
}

// keyFrame is an array or object checkKeys is in.
type keyFrame struct {
	arr     bool
	wantKey bool   // in an object, the next token is a key
	key     string // in an object, the key whose value is being read
}

// checkKeys reads the first JSON value of data once, as a stream of
// tokens, and reports (keyCheck) its first duplicate key, and, when names
// is not nil, the first key of the top-level object not spelled exactly
// as one of names (encoding/json matches keys without regard to case, so
// "Task" would fill task). When maxDepth > 0 it stops where arrays and
// objects nest deeper than maxDepth. Its memory is the stack of open
// arrays and objects with their current keys and the names of the open
// objects (for the duplicate check): linear in len(data), and bounded by
// maxDepth frames. It stops quietly at a syntax error, which the caller's
// decoder reports.
func checkKeys(data []byte, names []string, maxDepth int) keyCheck {
	var kc keyCheck
	// Duplicate names are refused (the default); invalid UTF-8 is the
	// store's concern (broker.CheckJSON), as it is encoding/json's.
	d := keyDecoders.Get().(*jsontext.Decoder)
	d.Reset(bytes.NewBuffer(data), jsontext.AllowInvalidUTF8(true))
	defer func() {
		d.Reset(bytes.NewReader(nil))
		keyDecoders.Put(d)
	}()
	var frames []keyFrame
	for {
		tok, err := d.ReadToken()
		if err != nil {
			var se *jsontext.SyntacticError
			if errors.Is(err, jsontext.ErrDuplicateName) && errors.As(err, &se) && len(frames) > 0 {
				frames[len(frames)-1].key = se.JSONPointer.LastToken()
				kc.dup = keyPath(frames)
			}
			return kc
		}
		kind := tok.Kind()
		if n := len(frames); n > 0 && frames[n-1].wantKey && kind == '"' {
			k := tok.String()
			if names != nil && n == 1 && kc.unknown == "" && !slices.Contains(names, k) {
				kc.unknown = k
			}
			frames[n-1].key, frames[n-1].wantKey = k, false
			continue
		}
		switch kind {
		case '{', '[':
			if maxDepth > 0 && len(frames) >= maxDepth {
				kc.tooDeep = true
				if !frames[0].arr {
					kc.field = frames[0].key
				}
				return kc
			}
			frames = append(frames, keyFrame{arr: kind == '[', wantKey: kind == '{'})
			continue
		case '}', ']':
			frames = frames[:len(frames)-1]
		}
		// A value ended: in an object, a key comes next.
		if n := len(frames); n == 0 {
			return kc
		} else if !frames[n-1].arr {
			frames[n-1].wantKey = true
		}
	}
}

// keyDecoders keeps token decoders for checkKeys, which runs once per
// task of a batch.
var keyDecoders = sync.Pool{New: func() any { return jsontext.NewDecoder(bytes.NewReader(nil)) }}

// keyPath is the path of the value being read in the innermost of frames:
// "a.b", "a[].b", "[]".
func keyPath(frames []keyFrame) string {
	var b strings.Builder
	for _, f := range frames {
		switch {
		case f.arr:
			b.WriteString("[]")
		case b.Len() == 0:
			b.WriteString(f.key)
		default:
			b.WriteString(".")
			b.WriteString(f.key)
		}
	}
	return b.String()
}

// jsonNames returns the JSON keys of the struct v points to, or nil when
// v is not a struct. The caller must not change the answer.
func jsonNames(v any) []string {
	t := reflect.TypeOf(v)
	if names, ok := jsonNamesOf.Load(t); ok {
		return names.([]string)
	}
	names := structJSONNames(t)
	jsonNamesOf.Store(t, names)
	return names
}

// jsonNamesOf remembers jsonNames's answers by type.
var jsonNamesOf sync.Map

func structJSONNames(t reflect.Type) []string {
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
