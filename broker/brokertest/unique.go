package brokertest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// keyed is a request of task "k" on topic with unique key key.
func keyed(topic, key string) broker.SubmitRequest {
	return broker.SubmitRequest{Topic: topic, Task: "k", UniqueKey: key}
}

// submitKeyed submits req and returns its id and whether it was a
// duplicate, failing on any other error.
func submitKeyed(t *testing.T, b broker.Broker, req broker.SubmitRequest) (int64, bool) {
	t.Helper()
	id, err := b.Submit(ctxOf(t), req)
	if err != nil {
		holder, dup := broker.DuplicateOf(err)
		if !dup || !errors.Is(err, broker.ErrDuplicate) {
			t.Fatalf("Submit(key %q): %v", req.UniqueKey, err)
		}
		if holder != id {
			t.Fatalf("Submit(key %q) returned id %d with a duplicate error naming %d", req.UniqueKey, id, holder)
		}
		return id, true
	}
	return id, false
}

// countTopic returns the number of messages of topic (all states).
func countTopic(t *testing.T, b broker.Broker, topic string) int {
	t.Helper()
	return len(list(t, b, broker.MessageFilter{Topic: topic, Limit: broker.MaxListLimit}))
}

// testUniqueConcurrent: 16 concurrent submits of one key store one message;
// every other submit is a duplicate naming it.
func testUniqueConcurrent(t *testing.T, b broker.Broker) {
	const n = 16
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		ids   = make([]int64, n)
		dups  = make([]bool, n)
		errs  = make([]error, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			id, err := b.Submit(ctxOf(t), keyed("uq", "same"))
			if holder, dup := broker.DuplicateOf(err); dup {
				ids[i], dups[i] = holder, true
				return
			}
			ids[i], errs[i] = id, err
		}()
	}
	close(start)
	wg.Wait()
	created := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("submit %d: %v", i, errs[i])
		}
		if !dups[i] {
			created++
		}
		if ids[i] != ids[0] {
			t.Fatalf("submits answered ids %v, want one id", ids)
		}
	}
	if created != 1 {
		t.Fatalf("%d of %d concurrent submits of one key created a message, want 1", created, n)
	}
	if c := countTopic(t, b, "uq"); c != 1 {
		t.Fatalf("%d messages stored, want 1", c)
	}
	m := get(t, b, ids[0])
	if m.UniqueKey != "same" {
		t.Fatalf("message's unique key = %q, want %q", m.UniqueKey, "same")
	}
}

// testUniqueStates: a key is held while its message is queued or running
// (the default states), and free once it ends; with done among its
// states, a done message keeps it; keys are global across topics.
func testUniqueStates(t *testing.T, b broker.Broker) {
	id, dup := submitKeyed(t, b, keyed("us", "a"))
	if dup {
		t.Fatal("first submit of a key is a duplicate")
	}
	if got, dup := submitKeyed(t, b, keyed("us-other", "a")); !dup || got != id {
		t.Fatalf("queued holder: submit on another topic = %d, duplicate %t; want %d, true", got, dup, id)
	}
	m := claimOne(t, b, "w", "us")
	if got, dup := submitKeyed(t, b, keyed("us", "a")); !dup || got != id {
		t.Fatalf("running holder: submit = %d, duplicate %t; want %d, true", got, dup, id)
	}
	ack(t, b, m.ClaimOf(), "")
	id2, dup := submitKeyed(t, b, keyed("us", "a"))
	if dup || id2 == id {
		t.Fatalf("after the holder is done: submit = %d, duplicate %t; want a new message", id2, dup)
	}

	// Done among the states: the done message keeps holding its key.
	req := keyed("us2", "b")
	req.UniqueStates = []string{"queued", "running", "done"}
	idb, _ := submitKeyed(t, b, req)
	ackNext(t, b, "us2")
	if got, dup := submitKeyed(t, b, req); !dup || got != idb {
		t.Fatalf("done holder with done in its states: submit = %d, duplicate %t; want %d, true", got, dup, idb)
	}
	if c := countTopic(t, b, "us2"); c != 1 {
		t.Fatalf("us2: %d messages, want 1", c)
	}

	// A failed message whose key another took meanwhile is not requeued.
	setTopic(t, b, "us3", broker.TopicPatch{DeadLetterEnabled: ptr(false)})
	idf, _ := submitKeyed(t, b, keyed("us3", "c"))
	mf := claimOne(t, b, "w", "us3")
	if err := b.Nack(ctxOf(t), broker.NackRequest{Claim: mf.ClaimOf(), Error: "bad"}); err != nil {
		t.Fatal(err)
	}
	wantState(t, b, idf, broker.StateFailed)
	idn, dup := submitKeyed(t, b, keyed("us3", "c"))
	if dup {
		t.Fatal("a failed holder still holds its key")
	}
	if err := b.Requeue(ctxOf(t), idf); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("Requeue of a failed message whose key %d holds: %v, want ErrInvalid", idn, err)
	}
	wantState(t, b, idf, broker.StateFailed)
	// Requeued with the key free again, it holds it again.
	ackNext(t, b, "us3")
	if err := b.Requeue(ctxOf(t), idf); err != nil {
		t.Fatalf("Requeue with the key free: %v", err)
	}
	if got, dup := submitKeyed(t, b, keyed("us3", "c")); !dup || got != idf {
		t.Fatalf("after the requeue: submit = %d, duplicate %t; want %d, true", got, dup, idf)
	}
}

// testUniqueWindow: with unique_for, a message created within the window
// holds its key whatever its state; once the window has passed, the key is
// free.
func testUniqueWindow(t *testing.T, b broker.Broker) {
	id, _ := submitKeyed(t, b, keyed("uw", "w"))
	ackNext(t, b, "uw")
	req := keyed("uw", "w")
	req.UniqueFor = time.Hour
	if got, dup := submitKeyed(t, b, req); !dup || got != id {
		t.Fatalf("done message within the window: submit = %d, duplicate %t; want %d, true", got, dup, id)
	}
	if c := countTopic(t, b, "uw"); c != 1 {
		t.Fatalf("%d messages after a duplicate by the window, want 1", c)
	}
	// Without a window the done message does not hold the key.
	id2, dup := submitKeyed(t, b, keyed("uw", "w"))
	if dup {
		t.Fatal("done message holds its key without a window")
	}
	ackNext(t, b, "uw")
	// A short window passes: the key comes free (each refused try stores
	// nothing).
	short := keyed("uw", "w")
	short.UniqueFor = 50 * time.Millisecond
	var id3 int64
	eventually(t, 30*time.Second, "the 50ms window to pass", func() bool {
		var dup bool
		id3, dup = submitKeyed(t, b, short)
		if dup && id3 != id2 {
			t.Fatalf("duplicate of %d, want the latest message %d", id3, id2)
		}
		return !dup
	})
	if c := countTopic(t, b, "uw"); c != 3 {
		t.Fatalf("%d messages, want 3", c)
	}
}

// testUniqueBatch: within one batch a key's later requests collapse to the
// first; a key already held is a duplicate of its holder.
func testUniqueBatch(t *testing.T, b broker.Broker) {
	held, _ := submitKeyed(t, b, keyed("ub", "held"))
	reqs := []broker.SubmitRequest{
		keyed("ub", "k1"),
		{Topic: "ub", Task: "plain"},
		keyed("ub", "k1"),
		keyed("ub", "held"),
		keyed("ub", "k2"),
		keyed("ub", "k1"),
	}
	out, err := b.SubmitBatch(ctxOf(t), reqs)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	if len(out) != len(reqs) {
		t.Fatalf("SubmitBatch returned %d results for %d requests", len(out), len(reqs))
	}
	want := []bool{false, false, true, true, false, true}
	for i, s := range out {
		if s.Duplicate != want[i] {
			t.Fatalf("result %d = %+v, duplicate want %t (all: %+v)", i, s, want[i], out)
		}
	}
	if out[2].ID != out[0].ID || out[5].ID != out[0].ID || out[3].ID != held {
		t.Fatalf("duplicates' ids = %+v, want 2 and 5 = 0's, 3 = %d", out, held)
	}
	if !(out[0].ID < out[1].ID && out[1].ID < out[4].ID) {
		t.Fatalf("new ids %d, %d, %d are not in request order", out[0].ID, out[1].ID, out[4].ID)
	}
	if c := countTopic(t, b, "ub"); c != 4 {
		t.Fatalf("%d messages, want 4 (held, k1, plain, k2)", c)
	}
	// SubmitMany answers the holders' ids.
	ids, err := b.SubmitMany(ctxOf(t), []broker.SubmitRequest{keyed("ub", "k2"), keyed("ub", "k3")})
	if err != nil || len(ids) != 2 || ids[0] != out[4].ID || ids[1] <= out[4].ID {
		t.Fatalf("SubmitMany = %v, %v; want [%d, new]", ids, err, out[4].ID)
	}
}

// testPriorityOrder: under a concurrency limit of 1, messages are claimed
// highest priority first, then oldest; a delayed high-priority message
// does not hold the others back.
func testPriorityOrder(t *testing.T, b broker.Broker) {
	setTopic(t, b, "pr", broker.TopicPatch{ConcurrencyLimit: ptr(1)})
	prios := []int{0, 5, -3, 5, 100, 0, -100}
	var all []int64
	for _, p := range prios {
		all = append(all, submit(t, b, broker.SubmitRequest{Topic: "pr", Task: "p", Priority: p}))
	}
	submit(t, b, broker.SubmitRequest{Topic: "pr", Task: "later", Priority: 100, Delay: time.Hour})
	want := []int64{all[4], all[1], all[3], all[0], all[5], all[2], all[6]}
	var got []int64
	for range want {
		msgs := claim(t, b, "w", 5, "pr")
		if len(msgs) != 1 {
			t.Fatalf("claim under a limit of 1 returned %d messages", len(msgs))
		}
		got = append(got, msgs[0].ID)
		ack(t, b, msgs[0].ClaimOf(), "")
	}
	if !slices.Equal(got, want) {
		t.Fatalf("claim order %v, want %v (priorities %v)", got, want, prios)
	}
	claimNone(t, b, "pr")
	if m := get(t, b, all[4]); m.Priority != 100 {
		t.Fatalf("stored priority = %d, want 100", m.Priority)
	}
	// Without a limit, one claim returns them in the same order.
	for _, p := range []int{1, 3, 2} {
		submit(t, b, broker.SubmitRequest{Topic: "pr2", Task: "p", Priority: p})
	}
	msgs := claim(t, b, "w", 3, "pr2")
	if len(msgs) != 3 || msgs[0].Priority != 3 || msgs[1].Priority != 2 || msgs[2].Priority != 1 {
		t.Fatalf("claim of three returned priorities %v, want 3, 2, 1", prioritiesOf(msgs))
	}
}

func prioritiesOf(msgs []broker.Message) []int {
	out := make([]int, len(msgs))
	for i, m := range msgs {
		out[i] = m.Priority
	}
	return out
}

// testRunAt: a run-at time in the future delays the message to it; one in
// the recent past makes it available at once.
func testRunAt(t *testing.T, b broker.Broker) {
	at := time.Now().Add(time.Hour).Truncate(time.Second)
	id := submit(t, b, broker.SubmitRequest{Topic: "ra", Task: "r", RunAt: at})
	claimNone(t, b, "ra")
	if m := get(t, b, id); !m.AvailableAt.Equal(at) {
		t.Fatalf("available_at = %v, want the run-at time %v", m.AvailableAt, at)
	}
	past := submit(t, b, broker.SubmitRequest{Topic: "ra", Task: "r", RunAt: time.Now().Add(-time.Hour)})
	if m := claimOne(t, b, "w", "ra"); m.ID != past {
		t.Fatalf("claimed %d, want the message whose run-at time is past (%d)", m.ID, past)
	}
}

// testInvalidIntake: bad unique keys, priorities and run-at times are
// ErrInvalid and store nothing, in Submit and SubmitBatch alike.
func testInvalidIntake(t *testing.T, b broker.Broker) {
	long := make([]byte, broker.MaxUniqueKeyLen+1)
	for i := range long {
		long[i] = 'k'
	}
	base := broker.SubmitRequest{Topic: "bad-intake", Task: "x"}
	cases := []struct {
		name string
		f    func(r *broker.SubmitRequest)
	}{
		{"key too long", func(r *broker.SubmitRequest) { r.UniqueKey = string(long) }},
		{"window without key", func(r *broker.SubmitRequest) { r.UniqueFor = time.Minute }},
		{"states without key", func(r *broker.SubmitRequest) { r.UniqueStates = []string{"queued", "running"} }},
		{"unknown state", func(r *broker.SubmitRequest) {
			r.UniqueKey = "k"
			r.UniqueStates = []string{"queued", "running", "bogus"}
		}},
		{"states without running", func(r *broker.SubmitRequest) { r.UniqueKey = "k"; r.UniqueStates = []string{"queued", "done"} }},
		{"negative window", func(r *broker.SubmitRequest) { r.UniqueKey = "k"; r.UniqueFor = -time.Second }},
		{"priority too high", func(r *broker.SubmitRequest) { r.Priority = broker.MaxPriority + 1 }},
		{"priority too low", func(r *broker.SubmitRequest) { r.Priority = broker.MinPriority - 1 }},
		{"run_at far past", func(r *broker.SubmitRequest) { r.RunAt = time.Now().Add(-25 * time.Hour) }},
		{"run_at beyond the delay limit", func(r *broker.SubmitRequest) { r.RunAt = time.Now().Add(broker.MaxDelay + time.Hour) }},
		{"run_at and delay", func(r *broker.SubmitRequest) { r.RunAt = time.Now().Add(time.Minute); r.Delay = time.Minute }},
	}
	for _, c := range cases {
		req := base
		c.f(&req)
		if _, err := b.Submit(ctxOf(t), req); !errors.Is(err, broker.ErrInvalid) {
			t.Errorf("%s: Submit = %v, want ErrInvalid", c.name, err)
		}
		batch := []broker.SubmitRequest{keyed("bad-intake", "fine"), req}
		_, err := b.SubmitBatch(ctxOf(t), batch)
		if !errors.Is(err, broker.ErrInvalid) {
			t.Errorf("%s: SubmitBatch = %v, want ErrInvalid", c.name, err)
		} else if err != nil && !containsIndex(err, 1) {
			t.Errorf("%s: SubmitBatch error %q does not name request 1", c.name, err)
		}
	}
	if c := countTopic(t, b, "bad-intake"); c != 0 {
		t.Fatalf("%d messages stored by invalid requests", c)
	}
	for _, tc := range topicsOf(t, b) {
		if tc == "bad-intake" {
			t.Fatal("invalid requests created their topic")
		}
	}
	// The good one of those batches was not stored either: its key is free.
	if _, dup := submitKeyed(t, b, keyed("bad-intake", "fine")); dup {
		t.Fatal("a request of a refused batch holds its key")
	}
}

func containsIndex(err error, i int) bool {
	return strings.Contains(err.Error(), fmt.Sprintf("request %d", i))
}

// ackNext claims one message of topic and acks it.
func ackNext(t *testing.T, b broker.Broker, topic string) {
	t.Helper()
	m := claimOne(t, b, "w", topic)
	ack(t, b, m.ClaimOf(), "")
}

func topicsOf(t *testing.T, b broker.Broker) []string {
	t.Helper()
	ts, err := b.Topics(ctxOf(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range ts {
		out = append(out, c.Name)
	}
	return out
}

// testUniqueScheduleFire: a schedule keeps its unique key; a fire whose
// key is held submits nothing and names the holder, and the slot counts as
// fired.
func testUniqueScheduleFire(t *testing.T, b broker.Broker) {
	long := strings.Repeat("k", broker.MaxUniqueKeyLen+1)
	_, err := b.PutSchedule(ctxOf(t), broker.Schedule{Name: "bad-key", Task: "k", Topic: "usf", IntervalSeconds: 60, UniqueKey: long})
	wantErr(t, "PutSchedule with a long unique key", err, broker.ErrInvalid)
	s := putSchedule(t, b, broker.Schedule{Name: "keyed", Task: "k", Topic: "usf", IntervalSeconds: 60, Enabled: true, UniqueKey: "nightly"})
	if s.UniqueKey != "nightly" {
		t.Fatalf("stored schedule's unique key = %q, want nightly", s.UniqueKey)
	}
	if got, err := b.GetSchedule(ctxOf(t), "keyed"); err != nil || got.UniqueKey != "nightly" {
		t.Fatalf("GetSchedule = %+v, %v; want unique key nightly", got, err)
	}
	base := time.Now().UTC().Truncate(time.Minute)
	sub := &broker.SubmitRequest{Topic: "usf", Task: "k", UniqueKey: s.UniqueKey}
	first := fire(t, b, broker.FireRequest{Name: "keyed", Slot: base, Next: base.Add(time.Minute), Submit: sub})
	if !first.Fired || first.Duplicate || first.MessageID == 0 {
		t.Fatalf("first fire = %+v, want a new message", first)
	}
	second := fire(t, b, broker.FireRequest{Name: "keyed", Slot: base.Add(time.Minute), Next: base.Add(2 * time.Minute), Submit: sub})
	if !second.Fired || !second.Duplicate || second.MessageID != first.MessageID {
		t.Fatalf("second fire while the first task is queued = %+v, want a duplicate of %d", second, first.MessageID)
	}
	if c := countTopic(t, b, "usf"); c != 1 {
		t.Fatalf("%d messages, want 1", c)
	}
	again := fire(t, b, broker.FireRequest{Name: "keyed", Slot: base.Add(time.Minute), Next: base.Add(2 * time.Minute), Submit: sub})
	if again.Fired {
		t.Fatalf("the slot of the duplicate fired again: %+v", again)
	}
}
