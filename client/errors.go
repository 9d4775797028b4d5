package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// ErrOutcomeUnknown: a request that changes something (a submit, a
// schedule's change, an action) may or may not have been done. The host
// answers so (a 502 or 504 with "X-Taskhost-Outcome: unknown") when the
// plugin stopped or timed out while it handled the request, and the
// client says so when the connection broke, or the context ended, after
// the request left. Such a request is never retried automatically: look
// before sending it again (for a submit, List with the task's name shows
// the newest ones). Test with errors.Is.
var ErrOutcomeUnknown = errors.New("the outcome is unknown")

// APIError is an answer of the host with a status of 400 or more. Message
// is the host's own, written for a person (what is wrong and what to
// do). Test with errors.As, or with IsNotFound and the other helpers.
type APIError struct {
	// Status is the HTTP status, such as 404.
	Status int
	// Message is the "error" of the JSON answer, or the start of the
	// body when the answer is not JSON.
	Message string
	// OutcomeUnknown: the host said X-Taskhost-Outcome: unknown;
	// errors.Is(err, ErrOutcomeUnknown) is true.
	OutcomeUnknown bool
	// RetryAfter is the answer's Retry-After, 0 when it had none.
	RetryAfter time.Duration
}

// Error is the host's message with the status.
func (e *APIError) Error() string {
	return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status)
}

// Is makes errors.Is(err, ErrOutcomeUnknown) true for an answer that said
// the outcome is unknown.
func (e *APIError) Is(target error) bool {
	return target == ErrOutcomeUnknown && e.OutcomeUnknown
}

// apiError is the *APIError of a non-2xx answer with body data.
func apiError(resp *http.Response, data []byte) *APIError {
	e := &APIError{
		Status:         resp.StatusCode,
		OutcomeUnknown: strings.EqualFold(resp.Header.Get("X-Taskhost-Outcome"), "unknown"),
		RetryAfter:     retryAfter(resp.Header),
	}
	var body struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(data, &body) == nil && body.Error != "" {
		e.Message = body.Error
	} else if s := strings.TrimSpace(string(data)); s != "" {
		if len(s) > 300 {
			s = s[:300] + "..."
		}
		e.Message = s
	} else {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}

// StatusOf is the HTTP status of an *APIError in err's chain, 0 when
// there is none (the host was not reached, or the call failed otherwise).
func StatusOf(err error) int {
	var e *APIError
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// IsNotFound: no such task, schedule, report or plugin (404).
func IsNotFound(err error) bool { return StatusOf(err) == http.StatusNotFound }

// IsBadRequest: the host refused the request as it is (400); the message
// says which field is wrong and why. Sending it again changes nothing.
func IsBadRequest(err error) bool { return StatusOf(err) == http.StatusBadRequest }

// IsConflict: the thing exists already, such as a schedule's name (409).
func IsConflict(err error) bool { return StatusOf(err) == http.StatusConflict }

// IsUnauthorized: the host wants the admin token (401), or refuses every
// token from this address for a while after too many wrong ones (429).
func IsUnauthorized(err error) bool {
	s := StatusOf(err)
	return s == http.StatusUnauthorized || s == http.StatusTooManyRequests
}

// IsUnavailable: the plugin or its broker cannot serve now (503), still so
// after the retries; sending it again later is safe.
func IsUnavailable(err error) bool { return StatusOf(err) == http.StatusServiceUnavailable }

// BatchError is a batch upload that stopped at a bad line: every line
// before Line is stored (Stored tasks), nothing from it on. Fix the line
// and send the lines from Line on again.
type BatchError struct {
	// Line is the bad line, from 1 (blank lines count). For SubmitBatch
	// and SubmitTasks the line is the task's index plus one.
	Line int
	// Stored is how many tasks of the upload are stored.
	Stored int
	// Message says what is wrong with the line, starting "line K: ".
	Message string
}

// Error is the host's message and what was stored.
func (e *BatchError) Error() string {
	return fmt.Sprintf("%s (the %d tasks before line %d are stored, nothing from it on)", e.Message, e.Stored, e.Line)
}
