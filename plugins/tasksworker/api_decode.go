package tasksworker

// Strict decoding of a JSON request body, or of one item of a batch, with
// messages for a person.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/taskhost/taskhost/broker"
)

// decodeBody decodes one JSON object strictly into v (decodeJSON), from a
// body of at most limit bytes; a refusal is answered 400 and false
// returned. example shows a good body.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any, example string) bool {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err == nil {
		err = decodeJSON(data, v, example, "the request body")
	}
	var tooBig *http.MaxBytesError
	switch {
	case err == nil:
		return true
	case errors.As(err, &tooBig):
		writeError(w, http.StatusBadRequest, "the request body is over %d bytes; send a smaller payload", tooBig.Limit)
	default:
		writeError(w, http.StatusBadRequest, "%v", err)
	}
	return false
}

// decodeJSON decodes the JSON object data strictly into v: unknown
// fields, duplicate keys, trailing data and a field nested deeper than
// broker.MaxJSONDepth are errors with a message for a person, which names
// data as what ("the request body", "the line"). example shows a good
// object.
func decodeJSON(data []byte, v any, example, what string) error {
	// First, in memory bounded by the depth: a payload nested thousands
	// deep is refused before anything else reads it.
	keys := checkKeys(data, jsonNames(v), broker.MaxJSONDepth+1)
	switch {
	case keys.tooDeep && keys.field != "":
		return fmt.Errorf("field %q nests arrays and objects more than %d levels deep (the limit is %d): flatten it, or store the data elsewhere and pass a reference", keys.field, broker.MaxJSONDepth, broker.MaxJSONDepth)
	case keys.tooDeep:
		return fmt.Errorf("%s must be a JSON object, such as %s", what, example)
	}
	if string(bytes.TrimSpace(data)) == "null" {
		// Decoding null into v would leave it as it is, as an empty
		// object does, and be refused later for a missing field.
		return fmt.Errorf("%s must be a JSON object, such as %s; got null", what, example)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		switch {
		case dec.Decode(&struct{}{}) != io.EOF:
			return fmt.Errorf("%s holds more than one JSON value; send one object, such as %s", what, example)
		case keys.dup != "":
			return fmt.Errorf("key %q appears twice in %s; each key of an object must be unique", keys.dup, what)
		case keys.unknown != "":
			return fmt.Errorf("unknown field %q in %s (keys are case-sensitive); the fields are those of %s", keys.unknown, what, example)
		}
		return nil
	}
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return fmt.Errorf("%s is empty; send a JSON object, such as %s", what, example)
	case errors.As(err, &syntax), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%s is not valid JSON (%v); send an object, such as %s", what, err, example)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return fmt.Errorf("%s must be a JSON object, such as %s", what, example)
		}
		return fmt.Errorf("field %q must be a JSON %s, got %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fmt.Errorf("%s in %s; the fields are those of %s", strings.TrimPrefix(err.Error(), "json: "), what, example)
	}
	return fmt.Errorf("bad %s: %v; send an object, such as %s", strings.TrimPrefix(what, "the "), err, example)
}

func jsonKind(goKind string) string {
	switch {
	case strings.HasPrefix(goKind, "int"), strings.HasPrefix(goKind, "uint"):
		return "whole number (within range)"
	case strings.HasPrefix(goKind, "float"):
		return "number"
	case goKind == "bool":
		return "boolean"
	case goKind == "ptr":
		return "value of another type"
	}
	return goKind
}
