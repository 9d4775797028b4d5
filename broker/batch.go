package broker

import (
	"context"
	"fmt"
)

// BatchSubmitter is the batch submit of every Broker (it is part of the
// Broker interface): many messages in one call and one transaction
// (postgres: one statement per 5,000). It has a name of its own for code
// that only submits.
type BatchSubmitter interface {
	// SubmitMany validates every request, then queues them all at once
	// and returns their ids in the order of reqs. One invalid request fails
	// the whole call with ErrInvalid and nothing is stored; so does any
	// other error, and so do more than MaxSubmitBatch requests.
	SubmitMany(ctx context.Context, reqs []SubmitRequest) ([]int64, error)
	// SubmitBatch is SubmitMany saying, for each request, whether it was
	// a duplicate of the message whose id it returns (see
	// SubmitRequest.UniqueKey). Within one batch, a request whose unique
	// key an earlier request carries is a duplicate of that one.
	SubmitBatch(ctx context.Context, reqs []SubmitRequest) ([]Submitted, error)
}

// IDs returns the ids of a SubmitBatch answer.
func IDs(s []Submitted) []int64 {
	if s == nil {
		return nil
	}
	ids := make([]int64, len(s))
	for i, x := range s {
		ids[i] = x.ID
	}
	return ids
}

// MaxSubmitBatch bounds one SubmitMany call: one transaction holds the
// local store's write lock for all of it, and other writers wait.
const MaxSubmitBatch = 10000

// ValidateSubmitMany checks a SubmitMany call's requests as Submit checks
// one (ValidateSubmit), and their number.
func ValidateSubmitMany(reqs []SubmitRequest, maxPayload int) error {
	if len(reqs) > MaxSubmitBatch {
		return Invalid("%d requests in one batch, the limit is %d: send several batches", len(reqs), MaxSubmitBatch)
	}
	for i, req := range reqs {
		if err := ValidateSubmit(req, maxPayload); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
	}
	return nil
}

// AckClaimer is implemented by brokers that can write acks and claim in
// one round trip (postgres: one transaction, so one commit serves both).
// The worker pool uses it when the broker has it.
type AckClaimer interface {
	// AckAndClaim is Ack(outcomes) followed by Claim(req) as one call: the
	// acks are written first, so the claim sees the concurrency-limit slots
	// they free. It returns what Ack and Claim would: one error per outcome
	// (nil or ErrClaimLost) and the claimed messages. When err is not nil,
	// nothing was written or claimed.
	AckAndClaim(ctx context.Context, outcomes []Outcome, req ClaimRequest) ([]error, []Message, error)
}
