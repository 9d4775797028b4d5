package broker

import (
	"context"
	"errors"
	"fmt"
)

// ErrFinished: the message has already finished (done, failed, dead or
// cancelled), so it cannot be cancelled. The error names its state.
var ErrFinished = errors.New("the task has finished")

// CancelledError is the last error of a message cancelled while queued,
// and of a cancelled attempt that gave no reason.
const CancelledError = "cancelled"

// Finished reports whether state is a terminal state.
func Finished(state string) bool {
	switch state {
	case StateDone, StateFailed, StateDead, StateCancelled:
		return true
	}
	return false
}

// FinishedError is what Cancel returns for a finished message m: it wraps
// ErrFinished and names the state.
func FinishedError(m Message) error {
	return fmt.Errorf("message %d is %s: %w", m.ID, m.State, ErrFinished)
}

// CancelFilter selects queued messages for CancelQueued: those of Topic
// and of Task where set. At least one must be set.
type CancelFilter struct {
	Topic string `json:"topic,omitempty"`
	Task  string `json:"task,omitempty"`
}

// ValidateCancelFilter checks f: an empty filter is invalid (it would
// cancel every queued message).
func ValidateCancelFilter(f CancelFilter) error {
	if f.Topic == "" && f.Task == "" {
		return Invalid("name a topic or a task (or both) to cancel their queued tasks")
	}
	if f.Topic != "" {
		if err := ValidateTopicName(f.Topic); err != nil {
			return err
		}
	}
	if len(f.Task) > MaxTaskLen {
		return Invalid("task name is %d bytes long, the limit is %d", len(f.Task), MaxTaskLen)
	}
	return nil
}

// Canceller is the cancellation part of Broker (see the package rules).
type Canceller interface {
	// Cancel cancels message id: a queued message ends cancelled at once
	// and is returned so; a running one has its CancelRequestedAt set
	// (once) and is returned still running, its claim kept until its
	// holder ends the attempt. A finished message is returned as it is
	// with an error wrapping ErrFinished; an unknown id is ErrNotFound.
	Cancel(ctx context.Context, id int64) (Message, error)
	// CancelQueued cancels the queued messages f selects and returns how
	// many; an empty filter is ErrInvalid.
	CancelQueued(ctx context.Context, f CancelFilter) (int, error)
	// CancelRequests returns the claims running under workerID whose
	// cancel was requested, by message id.
	CancelRequests(ctx context.Context, workerID string) ([]Claim, error)
}

// CancelNotifier is implemented by brokers that announce cancel requests
// of running messages to every process sharing the store at once
// (postgres: NOTIFY on the schema's cancel channel, see
// postgres.CancelChannel). The memory and local brokers have none: a
// worker learns of a request at its next CancelRequests poll.
type CancelNotifier interface {
	// CancelNotices returns a channel that receives the id of each
	// message whose cancel is requested from now on, in any process. Each
	// call returns a new channel, fed until the broker closes (it is
	// never closed); it is buffered and dropped into when its reader falls
	// behind, and nothing arrives while the listening connection is down,
	// so a reader polls CancelRequests too. Call it once per reader.
	CancelNotices() <-chan int64
}
