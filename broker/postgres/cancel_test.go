package postgres

import (
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// TestCancelNotices: a cancel request of a running message made by one
// host reaches the cancel notices of another host on the same schema at
// once, and only those: a request in another schema, and a payload that
// is not an id, are not handed on.
func TestCancelNotices(t *testing.T) {
	ctx := t.Context()
	holder := newTestBroker(t, Options{})
	other := otherHost(t, holder)
	elsewhere := newTestBroker(t, Options{})
	notices := holder.CancelNotices()
	waitFor(t, "the listener listening", holder.listen.listening.Load)

	run := func(b *Broker, n int) []broker.Message {
		t.Helper()
		for range n {
			if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "c", Task: "t"}); err != nil {
				t.Fatal(err)
			}
		}
		ms, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"c"}, Max: n})
		if err != nil || len(ms) != n {
			t.Fatalf("Claim = %d, %v; want %d", len(ms), err, n)
		}
		return ms
	}
	mine := run(holder, 2)
	theirs := run(elsewhere, 1)
	if theirs[0].ID != mine[0].ID {
		t.Fatalf("ids %d and %d: the test wants the same id in both schemas", theirs[0].ID, mine[0].ID)
	}
	// In order: a request in another schema, a payload that is not an
	// id, then the request this host must hear of.
	if _, err := elsewhere.Cancel(ctx, theirs[0].ID); err != nil {
		t.Fatal(err)
	}
	c := schemaConn(t, other)
	if _, err := c.Exec(ctx, `SELECT pg_notify($1, 'not an id')`, CancelChannel(other.Schema())); err != nil {
		t.Fatal(err)
	}
	if m, err := other.Cancel(ctx, mine[1].ID); err != nil || m.State != broker.StateRunning {
		t.Fatalf("Cancel = %s, %v", m.State, err)
	}
	select {
	case id := <-notices:
		if id != mine[1].ID {
			t.Fatalf("first cancel notice names %d, want %d", id, mine[1].ID)
		}
	case <-time.After(notifyDeadline):
		t.Fatalf("no cancel notice within %v", notifyDeadline)
	}
	if _, err := holder.Submit(ctx, broker.SubmitRequest{Topic: "c", Task: "t"}); err != nil {
		t.Fatal(err)
	}
	// The cancel of a queued message is announced to nobody: the next
	// notice is the next running one's.
	queued, err := holder.ListMessages(ctx, broker.MessageFilter{State: broker.StateQueued})
	if err != nil || len(queued) != 1 {
		t.Fatalf("queued = %v, %v", queued, err)
	}
	if _, err := other.Cancel(ctx, queued[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Cancel(ctx, mine[0].ID); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-notices:
		if id != mine[0].ID {
			t.Fatalf("second cancel notice names %d, want %d", id, mine[0].ID)
		}
	case <-time.After(notifyDeadline):
		t.Fatalf("no second cancel notice within %v", notifyDeadline)
	}
}

// TestCancelChannelFitsPostgresNames: the cancel channel is a valid
// channel name for every schema name, distinct per schema.
func TestCancelChannelFitsPostgresNames(t *testing.T) {
	long1, long2 := strings.Repeat("a", 63), strings.Repeat("a", 62)+"b"
	for _, schema := range []string{"", "public", "s1", long1} {
		if ch := CancelChannel(schema); len(ch) > 63 || !strings.HasPrefix(ch, "taskhost_cancel_") {
			t.Fatalf("CancelChannel(%q) = %q", schema, ch)
		}
	}
	if CancelChannel("") != CancelChannel("public") || CancelChannel(long1) == CancelChannel(long2) {
		t.Fatal("cancel channels: the default schema's differs from public's, or two long schemas share one")
	}
}
