package worker

import (
	"context"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

// TestCompleterWritesEverythingAndStopsTwice: what is handed to the
// completer is written by the time stop returns (acks by the collectors
// themselves once no dispatcher takes them), the claims are released and
// the attempts reported; a second stop returns at once.
func TestCompleterWritesEverythingAndStopsTwice(t *testing.T) {
	ctx := context.Background()
	b := memory.New()
	ackID, nackID := submit(t, b, "x", `{}`), submit(t, b, "x", `{}`)
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{broker.DefaultTopic}, Max: 2})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("claim: %d messages, %v", len(msgs), err)
	}
	var claims holdings
	claims.init(2)
	claims.hold(msgs)
	rec := newRecorder()
	o := newCompleter(b, hclog.NewNullLogger(), "w", rec, nil, &claims, 1)
	o.start()
	o.closeAcks() // no dispatcher
	for i := range msgs {
		m := &msgs[i]
		c := &completion{claim: m.ClaimOf(), topic: m.Topic, task: m.Task, msg: m}
		if m.ID == ackID {
			c.ack, c.status = true, StatusDone
		} else {
			c.fail("boom", false, 0)
		}
		o.add(c)
	}
	o.stop()
	o.stop()
	if m, _ := b.GetMessage(ctx, ackID); m.State != broker.StateDone {
		t.Errorf("acked message is %s, want done", m.State)
	}
	if m, _ := b.GetMessage(ctx, nackID); m.State != broker.StateDead || m.LastError != "boom" {
		t.Errorf("failed message is %s (%q), want dead (boom)", m.State, m.LastError)
	}
	for _, m := range msgs {
		if held, _ := claims.holds(m.ClaimOf()); held {
			t.Errorf("message %d still held after stop", m.ID)
		}
	}
	if n := o.pending.Load(); n != 0 {
		t.Errorf("%d outcomes pending after stop", n)
	}
	if rec.count(StatusDone) != 1 || rec.count(StatusFailed) != 1 {
		t.Errorf("reported %v, want one done and one failed", rec.statuses)
	}
}
