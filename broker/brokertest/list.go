package brokertest

import (
	"errors"
	"slices"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

func testListMessages(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	var a, bb []int64
	for i := range 6 {
		a = append(a, submit(t, b, broker.SubmitRequest{Topic: "la", Task: []string{"x", "y"}[i%2]}))
		bb = append(bb, submit(t, b, broker.SubmitRequest{Topic: "lb", Task: "x"}))
	}
	m := claimOne(t, b, "w", "la") // a[0] running
	second := claimOne(t, b, "w", "la")
	ack(t, b, second.ClaimOf(), "")

	all := list(t, b, broker.MessageFilter{})
	if len(all) != 12 {
		t.Fatalf("ListMessages() returned %d, want 12", len(all))
	}
	for i := 1; i < len(all); i++ {
		if all[i].ID >= all[i-1].ID {
			t.Fatalf("ListMessages not newest first: %v", ids(all))
		}
	}
	for _, msg := range all {
		if msg.Token != "" {
			t.Fatalf("ListMessages exposes the token of %d", msg.ID)
		}
	}

	cases := []struct {
		name string
		f    broker.MessageFilter
		want []int64
	}{
		{"topic", broker.MessageFilter{Topic: "lb"}, reversed(bb)},
		{"topic and task", broker.MessageFilter{Topic: "la", Task: "y"}, []int64{a[5], a[3], a[1]}},
		{"task across topics", broker.MessageFilter{Task: "y"}, []int64{a[5], a[3], a[1]}},
		{"running", broker.MessageFilter{State: broker.StateRunning}, []int64{m.ID}},
		{"done", broker.MessageFilter{State: broker.StateDone}, []int64{a[1]}},
		{"queued in la", broker.MessageFilter{State: broker.StateQueued, Topic: "la"}, []int64{a[5], a[4], a[3], a[2]}},
		{"limit", broker.MessageFilter{Topic: "lb", Limit: 2}, []int64{bb[5], bb[4]}},
		{"page", broker.MessageFilter{Topic: "lb", Limit: 2, Before: bb[4]}, []int64{bb[3], bb[2]}},
		{"last page", broker.MessageFilter{Topic: "lb", Limit: 5, Before: bb[1]}, []int64{bb[0]}},
		{"past the end", broker.MessageFilter{Topic: "lb", Before: bb[0]}, nil},
		{"no match", broker.MessageFilter{Topic: "nope"}, nil},
		{"state dead none", broker.MessageFilter{State: broker.StateDead}, nil},
	}
	if m.ID != a[0] {
		t.Fatalf("claimed %d, want %d", m.ID, a[0])
	}
	for _, c := range cases {
		got := ids(list(t, b, c.f))
		if !slices.Equal(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
			t.Errorf("%s: ListMessages(%+v) = %v, want %v", c.name, c.f, got, c.want)
		}
	}
	if _, err := b.ListMessages(ctx, broker.MessageFilter{State: "bogus"}); !errors.Is(err, broker.ErrInvalid) {
		t.Errorf("ListMessages(state bogus): %v, want ErrInvalid", err)
	}

	// Default limit 50; paging walks everything exactly once.
	for range 50 {
		submit(t, b, broker.SubmitRequest{Topic: "many", Task: "x"})
	}
	page := list(t, b, broker.MessageFilter{})
	if len(page) != 50 {
		t.Fatalf("default limit: %d, want 50", len(page))
	}
	seen := 0
	var before int64
	for {
		page := list(t, b, broker.MessageFilter{Limit: 7, Before: before})
		if len(page) == 0 {
			break
		}
		seen += len(page)
		before = page[len(page)-1].ID
	}
	if seen != 62 {
		t.Fatalf("paging saw %d messages, want 62", seen)
	}
}

func reversed(s []int64) []int64 {
	c := slices.Clone(s)
	slices.Reverse(c)
	return c
}
