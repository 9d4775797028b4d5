package local

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// TestErrorRetriesDoNotUseTheOrphanBudget: a message that failed and was
// retried four times, then orphaned once, is requeued, not dead-lettered,
// under an orphan budget of 3; its third orphaning dead-letters it.
func TestErrorRetriesDoNotUseTheOrphanBudget(t *testing.T) {
	b := openTest(t, Options{})
	ctx := context.Background()
	id := mustSubmit(t, b, "r")
	for range 4 {
		m := mustClaim(t, b, "alive", "r")
		if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Requeue: true, Error: "boom"}); err != nil {
			t.Fatal(err)
		}
	}
	req := broker.ReclaimRequest{Live: []string{"alive"}, MaxAttempts: 3}
	for orphaning := 1; orphaning <= 3; orphaning++ {
		m := mustClaim(t, b, "gone", "r")
		execSQL(t, b, `UPDATE tw_messages SET claimed_at = ? WHERE id = ?`, time.Now().Add(-time.Hour).UnixNano(), m.ID)
		res, err := b.ReclaimOrphans(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := b.GetMessage(ctx, id)
		switch {
		case orphaning < 3 && (res.Reclaimed != 1 || got.State != broker.StateQueued):
			t.Fatalf("orphaning %d after 4 error retries: %+v, state %s; want requeued", orphaning, res, got.State)
		case orphaning == 3 && (res.DeadLettered != 1 || got.State != broker.StateDead):
			t.Fatalf("third orphaning: %+v, state %s; want dead-lettered", res, got.State)
		case !strings.HasPrefix(got.LastError, broker.OrphanedErrorPrefix):
			// Workers tell a message that may have killed its worker by it.
			t.Fatalf("orphaning %d: last error %q does not start with %q", orphaning, got.LastError, broker.OrphanedErrorPrefix)
		}
	}
}
