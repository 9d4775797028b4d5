package ui

// The one mapping of the service's and the broker's errors to what a page
// says (a status and a message in plain words), and the message for a
// form's bad JSON.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

// failure is the one mapping of the service's errors to a page's
// status and a message: a refusal of the service (a *service.Problem)
// says what is wrong in its own words; a broker's failure is told by
// brokerProblem, what being what could not be done.
func failure(what string, err error) (int, string) {
	if p, ok := service.IsProblem(err); ok {
		switch {
		case errors.Is(p, service.ErrConflict):
			return http.StatusConflict, p.Msg
		case errors.Is(p, service.ErrUnavailable):
			return http.StatusServiceUnavailable, p.Msg
		}
		return http.StatusBadRequest, p.Msg
	}
	status := http.StatusServiceUnavailable
	switch {
	case errors.Is(err, broker.ErrInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, broker.ErrNotFound):
		status = http.StatusNotFound
	}
	return status, brokerProblem(what, err)
}

// brokerProblem says in plain words why a broker call failed.
func brokerProblem(what string, err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, broker.ErrInvalid):
		msg = strings.Replace(msg, broker.ErrInvalid.Error()+": ", "", 1)
		return fmt.Sprintf("Could not %s: %s.", what, strings.TrimSuffix(msg, "."))
	case errors.Is(err, broker.ErrNotFound):
		return fmt.Sprintf("Could not %s: it does not exist (any more).", what)
	case errors.Is(err, broker.ErrClosed):
		return fmt.Sprintf("Could not %s: the broker is closed (the plugin is stopping or restarting). Retry in a few seconds.", what)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("Could not %s: the broker did not answer in time. Retry later, and check the broker's health if it persists.", what)
	}
	return fmt.Sprintf("Could not %s: the broker failed (%s). Retry later, and check the broker's health if it persists.", what, msg)
}

// jsonProblem says in plain words what is wrong with a JSON text, or "".
func jsonProblem(what, s string) string {
	if json.Valid([]byte(s)) {
		return ""
	}
	var v any
	err := json.Unmarshal([]byte(s), &v)
	var syn *json.SyntaxError
	where := ""
	if errors.As(err, &syn) {
		line, col := 1, 1
		// Offset counts the offending byte; point at it.
		for _, c := range s[:max(0, min(int(syn.Offset)-1, len(s)))] {
			if c == '\n' {
				line, col = line+1, 1
			} else {
				col++
			}
		}
		where = fmt.Sprintf(" (%s, near line %d, column %d)", syn.Error(), line, col)
	} else if err != nil {
		where = " (" + err.Error() + ")"
	}
	return fmt.Sprintf(`The %s is not valid JSON%s. Write a JSON value such as {"hello": "world"}, or leave it empty for {}.`, what, where)
}
