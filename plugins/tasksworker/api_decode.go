package tasksworker

// Strict decoding of a JSON request body, with messages for a person.

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/taskhost/taskhost/broker"
)

// decodeBody decodes one JSON object strictly into v: unknown fields,
// duplicate keys, trailing data, an over-long body and a field nested
// deeper than broker.MaxJSONDepth are errors with a message for a person.
// example shows a good body.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any, example string) bool {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var keys keyCheck
	if err == nil {
		// First, in memory bounded by the depth: a payload nested
		// thousands deep is refused before anything else reads it.
		keys = checkKeys(data, jsonNames(v), broker.MaxJSONDepth+1)
		switch {
		case keys.tooDeep && keys.field != "":
			writeError(w, http.StatusBadRequest, "field %q nests arrays and objects more than %d levels deep (the limit is %d): flatten it, or store the data elsewhere and pass a reference", keys.field, broker.MaxJSONDepth, broker.MaxJSONDepth)
			return false
		case keys.tooDeep:
			writeError(w, http.StatusBadRequest, "the request body must be a JSON object, such as %s", example)
			return false
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
		if err == nil && dec.Decode(&struct{}{}) != io.EOF {
			writeError(w, http.StatusBadRequest, "the request body holds more than one JSON value; send one object, such as %s", example)
			return false
		}
	}
	if err == nil {
		switch {
		case keys.dup != "":
			writeError(w, http.StatusBadRequest, "key %q appears twice in the request body; each key of an object must be unique", keys.dup)
			return false
		case keys.unknown != "":
			writeError(w, http.StatusBadRequest, "unknown field %q in the request body (keys are case-sensitive); the fields are those of %s", keys.unknown, example)
			return false
		}
		return true
	}
	var tooBig *http.MaxBytesError
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusBadRequest, "the request body is over %d bytes; send a smaller payload", tooBig.Limit)
	case errors.Is(err, io.EOF):
		writeError(w, http.StatusBadRequest, "the request body is empty; send a JSON object, such as %s", example)
	case errors.As(err, &syntax), errors.Is(err, io.ErrUnexpectedEOF):
		writeError(w, http.StatusBadRequest, "the request body is not valid JSON (%v); send an object, such as %s", err, example)
	case errors.As(err, &typ):
		if typ.Field == "" {
			writeError(w, http.StatusBadRequest, "the request body must be a JSON object, such as %s", example)
		} else {
			writeError(w, http.StatusBadRequest, "field %q must be a JSON %s, got %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value)
		}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		writeError(w, http.StatusBadRequest, "%s in the request body; the fields are those of %s", strings.TrimPrefix(err.Error(), "json: "), example)
	default:
		writeError(w, http.StatusBadRequest, "bad request body: %v; send an object, such as %s", err, example)
	}
	return false
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
