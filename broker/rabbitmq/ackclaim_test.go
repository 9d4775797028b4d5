package rabbitmq

import (
	"errors"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

// TestAckAndClaimSeesTheSlotsItsAcksFree: on a topic of limit 1, the
// claim that goes with the ack of the running message takes the next one
// (the slot the ack frees counts), a stale outcome comes back lost, and
// the acked message is done. On both state stores.
func TestAckAndClaimSeesTheSlotsItsAcksFree(t *testing.T) {
	for _, kind := range []stateKind{onLocal, onPostgres} {
		t.Run(string(kind), func(t *testing.T) {
			b := openTest(t, kind, Options{})
			ctx := t.Context()
			if _, err := b.SetTopic(ctx, "one", broker.TopicPatch{ConcurrencyLimit: ptr(1)}); err != nil {
				t.Fatal(err)
			}
			first, second := mustSubmit(t, b, "one"), mustSubmit(t, b, "one")
			m := claimWithin(t, b, "w", "one")
			if m.ID != first {
				t.Fatalf("claimed %d, want %d", m.ID, first)
			}
			req := broker.ClaimRequest{WorkerID: "w", Topics: []string{"one"}, Max: 5}
			if ms, err := b.Claim(ctx, req); err != nil || len(ms) != 0 {
				t.Fatalf("claim at the limit: %v, %v; want nothing", ms, err)
			}
			stale := broker.Claim{ID: first, Token: "not-the-token"}
			errs, ms, err := b.AckAndClaim(ctx, []broker.Outcome{{Claim: m.ClaimOf()}, {Claim: stale}}, req)
			if err != nil {
				t.Fatal(err)
			}
			if len(errs) != 2 || errs[0] != nil || !errors.Is(errs[1], broker.ErrClaimLost) {
				t.Fatalf("outcome errors %v; want [nil, lost]", errs)
			}
			if len(ms) != 1 || ms[0].ID != second {
				t.Fatalf("AckAndClaim claimed %v; want message %d, in the slot the ack freed", ms, second)
			}
			got, err := b.GetMessage(ctx, first)
			if err != nil || got.State != broker.StateDone {
				t.Fatalf("message %d: %+v, %v; want done", first, got, err)
			}
			if _, _, err := b.AckAndClaim(ctx, []broker.Outcome{{Claim: ms[0].ClaimOf()}}, broker.ClaimRequest{Topics: []string{"one"}, Max: 1}); !errors.Is(err, broker.ErrInvalid) {
				t.Fatalf("AckAndClaim without a worker id: %v; want invalid", err)
			}
		})
	}
}
