package broker

import "context"

// BatchSubmitter is implemented by brokers that can queue many messages in
// one call (postgres: one statement, one transaction).
type BatchSubmitter interface {
	// SubmitMany validates every request, then queues them all at once
	// and returns their ids in the order of reqs. One invalid request fails
	// the whole call with ErrInvalid and nothing is stored; so does any
	// other error.
	SubmitMany(ctx context.Context, reqs []SubmitRequest) ([]int64, error)
}
