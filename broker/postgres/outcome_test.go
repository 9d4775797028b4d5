package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/taskhost/taskhost/broker"
)

// safeErr is an error that says whether its statement was sent, as
// pgconn's own do.
type safeErr bool

func (e safeErr) Error() string     { return "the connection broke" }
func (e safeErr) SafeToRetry() bool { return bool(e) }

// A write whose answer was lost is marked unknown; a write that could not
// be sent, a connection that could not be made and a refusal of the
// database's are not: they did nothing.
func TestUnansweredWritesHaveAnUnknownOutcome(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"the answer's read was reset", fmt.Errorf("postgres broker: submit: %w: %w", ErrUnavailable, reset), true},
		{"the answer ended early", io.ErrUnexpectedEOF, true},
		{"a driver error: sent", safeErr(false), true},
		{"a driver error: never sent", safeErr(true), false},
		{"no connection could be made", &pgconn.ConnectError{}, false},
		{"the database refused it", &pgconn.PgError{Code: "23505"}, false},
		{"the call ended before it was sent", context.Canceled, false},
		{"no error", nil, false},
	} {
		err := outcomeOf(c.err)
		if got := errors.Is(err, broker.ErrOutcomeUnknown); got != c.want {
			t.Errorf("%s: outcomeOf(%v) is unknown: %t, want %t", c.name, c.err, got, c.want)
		}
		if c.err != nil && !errors.Is(err, c.err) {
			t.Errorf("%s: outcomeOf(%v) = %v, which no longer wraps it", c.name, c.err, err)
		}
	}
}
