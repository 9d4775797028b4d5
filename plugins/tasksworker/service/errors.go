package service

// The service's own refusals. A broker's errors are returned as they are.

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalid: the request is wrong; nothing changed.
	ErrInvalid = errors.New("invalid request")
	// ErrConflict: what the request would create exists already.
	ErrConflict = errors.New("conflict")
	// ErrUnavailable: whether the request can be done cannot be told
	// now (a passing failure); retry shortly.
	ErrUnavailable = errors.New("unavailable")
)

// Problem is a refusal of the service with a message for a person: Error
// is the message alone; errors.Is matches its Kind (ErrInvalid,
// ErrConflict or ErrUnavailable).
type Problem struct {
	Kind error
	Msg  string
}

func (p *Problem) Error() string { return p.Msg }
func (p *Problem) Unwrap() error { return p.Kind }

func invalid(format string, args ...any) error {
	return &Problem{Kind: ErrInvalid, Msg: fmt.Sprintf(format, args...)}
}

// IsProblem returns err's *Problem, if it is one.
func IsProblem(err error) (*Problem, bool) {
	var p *Problem
	ok := errors.As(err, &p)
	return p, ok
}
