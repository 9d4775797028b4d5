package postgres

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/taskhost/taskhost/broker"
)

// unanswered reports whether err says a statement was sent and its answer
// never came: the connection broke, or the call gave up, while it waited
// for the answer, so the statement may have committed. Not so for a
// connection that could not be made, a statement never sent (pgconn says
// it is safe to retry) or a refusal of the database's.
func unanswered(err error) bool {
	if err == nil || pgconn.SafeToRetry(err) {
		return false
	}
	var pe *pgconn.PgError
	var ce *pgconn.ConnectError
	if errors.As(err, &pe) || errors.As(err, &ce) {
		return false
	}
	var sent interface{ SafeToRetry() bool }
	return errors.As(err, &sent) || unavailable(err)
}

// outcomeOf marks a write's error that leaves its outcome unknown with
// broker.ErrOutcomeUnknown.
func outcomeOf(err error) error {
	if unanswered(err) {
		return fmt.Errorf("%w: %w", broker.ErrOutcomeUnknown, err)
	}
	return err
}
