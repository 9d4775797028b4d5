package brokertest

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// cancelCases are the cancellation cases of Run.
var cancelCases = []testCase[broker.Broker]{
	{"CancelQueued", testCancelQueued},
	{"CancelRunning", testCancelRunning},
	{"CancelRacingAck", testCancelRacingAck},
	{"CancelRequestedThenRequeueEndsCancelled", testCancelRequeue},
	{"CancelStaleToken", testCancelStaleToken},
	{"CancelFinishedAndUnknown", testCancelFinished},
	{"CancelQueuedByFilter", testCancelQueuedFilter},
	{"CancelRacingClaim", testCancelRacingClaim},
	{"CancelNackRacingAck", testCancelNackRacingAck},
}

// cancelDurableCases are the cancellation cases of RunDurable.
var cancelDurableCases = []testCase[Store]{
	{"ReclaimOfCancelRequestedOrphan", testReclaimCancelRequested},
}

func cancel(t *testing.T, b broker.Broker, id int64) broker.Message {
	t.Helper()
	m, err := b.Cancel(ctxOf(t), id)
	if err != nil {
		t.Fatalf("Cancel(%d): %v", id, err)
	}
	if m.ID != id {
		t.Fatalf("Cancel(%d) returned message %d", id, m.ID)
	}
	return m
}

func cancelRequests(t *testing.T, b broker.Broker, worker string) []broker.Claim {
	t.Helper()
	cs, err := b.CancelRequests(ctxOf(t), worker)
	if err != nil {
		t.Fatalf("CancelRequests(%s): %v", worker, err)
	}
	return cs
}

// wantCancelled checks that message id ended cancelled with lastError.
func wantCancelled(t *testing.T, b broker.Broker, id int64, lastError string) broker.Message {
	t.Helper()
	m := wantState(t, b, id, broker.StateCancelled)
	if m.FinishedAt == nil || m.LastError != lastError || m.Token != "" {
		t.Fatalf("cancelled message %d: finished at %v, last error %q; want a finish time and %q", id, m.FinishedAt, m.LastError, lastError)
	}
	return m
}

// testCancelQueued: a queued message ends cancelled at once: no one claims
// it, it lists under its state, it is not requeued, and a second cancel
// finds it finished.
func testCancelQueued(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	q := submitN(t, b, "cq", 2)
	m := cancel(t, b, q[0])
	if m.State != broker.StateCancelled || m.FinishedAt == nil || m.LastError != broker.CancelledError || m.CancelRequestedAt != nil {
		t.Fatalf("Cancel of a queued message returned %+v; want it cancelled, finished, last error %q", m, broker.CancelledError)
	}
	wantCancelled(t, b, q[0], broker.CancelledError)
	if got := claimOne(t, b, "w", "cq"); got.ID != q[1] {
		t.Fatalf("claimed %d, want %d (the other is cancelled)", got.ID, q[1])
	}
	claimNone(t, b, "cq")
	if got := ids(list(t, b, broker.MessageFilter{State: broker.StateCancelled})); !slices.Equal(got, []int64{q[0]}) {
		t.Fatalf("cancelled messages %v, want [%d]", got, q[0])
	}
	if got := topicStats(t, stats(t, b), "cq"); got.Queued != 0 || got.Running != 1 {
		t.Fatalf("topic stats after the cancel: %+v; want nothing queued, one running", got)
	}
	err := b.Requeue(ctx, q[0])
	if !errors.Is(err, broker.ErrInvalid) || !strings.Contains(err.Error(), "submit it again") {
		t.Fatalf("Requeue of a cancelled message: %v, want ErrInvalid saying to submit it again", err)
	}
	again, err := b.Cancel(ctx, q[0])
	if !errors.Is(err, broker.ErrFinished) || !strings.Contains(err.Error(), broker.StateCancelled) || again.State != broker.StateCancelled {
		t.Fatalf("second Cancel = %s, %v; want the cancelled message and ErrFinished naming its state", again.State, err)
	}
}

// testCancelRunning: a cancel of a running message requests it (once)
// and keeps the claim, its slot and its locks until the holder ends the
// attempt with Nack{Cancel}; then it is cancelled and everything is
// released.
func testCancelRunning(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	setTopic(t, b, "cr", broker.TopicPatch{ConcurrencyLimit: ptr(1)})
	ids := submitN(t, b, "cr", 2)
	m := claimOne(t, b, "w1", "cr")
	acquire(t, b, "cr-lock", "w1", m.ClaimOf())
	if cs := cancelRequests(t, b, "w1"); len(cs) != 0 {
		t.Fatalf("cancel requests before any: %v", cs)
	}

	got := cancel(t, b, m.ID)
	if got.State != broker.StateRunning || got.CancelRequestedAt == nil || got.ClaimedBy != "w1" || got.Token != "" {
		t.Fatalf("Cancel of a running message returned %+v; want it running under w1 with its cancel requested", got)
	}
	first := *got.CancelRequestedAt
	again := cancel(t, b, m.ID)
	if again.CancelRequestedAt == nil || !again.CancelRequestedAt.Equal(first) {
		t.Fatalf("second Cancel moved the request time: %v, want %v", again.CancelRequestedAt, first)
	}
	if read := get(t, b, m.ID); read.CancelRequestedAt == nil || !read.CancelRequestedAt.Equal(first) || read.State != broker.StateRunning {
		t.Fatalf("GetMessage after the request: %s, requested at %v", read.State, read.CancelRequestedAt)
	}
	if cs := cancelRequests(t, b, "w1"); !slices.Equal(cs, []broker.Claim{m.ClaimOf()}) {
		t.Fatalf("CancelRequests(w1) = %v, want [%v]", cs, m.ClaimOf())
	}
	if cs := cancelRequests(t, b, "w2"); len(cs) != 0 {
		t.Fatalf("CancelRequests(w2) = %v, want none", cs)
	}
	// The claim keeps its slot and its lock.
	claimNone(t, b, "cr")
	if names := lockNames(t, b); !slices.Equal(names, []string{"cr-lock"}) {
		t.Fatalf("locks while the cancel is pending: %v", names)
	}

	if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Cancel: true, Error: "cancelled: requested"}); err != nil {
		t.Fatalf("Nack{Cancel}: %v", err)
	}
	end := wantCancelled(t, b, m.ID, "cancelled: requested")
	if end.CancelRequestedAt == nil || end.Attempts != 1 {
		t.Fatalf("cancelled message: requested at %v, %d attempts; want the request kept and 1 attempt", end.CancelRequestedAt, end.Attempts)
	}
	if names := lockNames(t, b); len(names) != 0 {
		t.Fatalf("locks after the cancelled attempt: %v, want none", names)
	}
	if cs := cancelRequests(t, b, "w1"); len(cs) != 0 {
		t.Fatalf("CancelRequests after the attempt ended: %v", cs)
	}
	if next := claimOne(t, b, "w1", "cr"); next.ID != ids[1] {
		t.Fatalf("claimed %d after the cancel freed the slot, want %d", next.ID, ids[1])
	}
	// A Nack{Cancel} without a reason says "cancelled"; it wins over
	// Requeue.
	if err := b.Nack(ctx, broker.NackRequest{Claim: broker.Claim{ID: ids[1], Token: claimedToken(t, b, "w1", ids[1])}, Cancel: true, Requeue: true}); err != nil {
		t.Fatalf("Nack{Cancel, Requeue}: %v", err)
	}
	wantCancelled(t, b, ids[1], broker.CancelledError)
	claimNone(t, b, "cr")
}

// claimedToken returns the token of the claim worker holds on id.
func claimedToken(t *testing.T, b broker.Broker, worker string, id int64) string {
	t.Helper()
	cs, err := b.RunningClaims(ctxOf(t), worker)
	if err != nil {
		t.Fatalf("RunningClaims: %v", err)
	}
	for _, c := range cs {
		if c.ID == id {
			return c.Token
		}
	}
	t.Fatalf("worker %s holds no claim on %d (holds %v)", worker, id, cs)
	return ""
}

// testCancelRacingAck: the holder's Ack with its valid token wins over a
// pending cancel request: the message is done, the cancel changes nothing
// after, and a late Nack{Cancel} finds its claim lost.
func testCancelRacingAck(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	submitN(t, b, "ra", 1)
	m := claimOne(t, b, "w", "ra")
	cancel(t, b, m.ID)
	ack(t, b, m.ClaimOf(), `{"ok":true}`)
	done := wantState(t, b, m.ID, broker.StateDone)
	if done.CancelRequestedAt == nil {
		t.Fatal("the done message lost the record of its cancel request")
	}
	after, err := b.Cancel(ctx, m.ID)
	if !errors.Is(err, broker.ErrFinished) || after.State != broker.StateDone {
		t.Fatalf("Cancel after the ack = %s, %v; want done and ErrFinished", after.State, err)
	}
	wantErr(t, "Nack{Cancel} after the ack", b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Cancel: true}), broker.ErrClaimLost)
	wantState(t, b, m.ID, broker.StateDone)
	if cs := cancelRequests(t, b, "w"); len(cs) != 0 {
		t.Fatalf("CancelRequests after the ack: %v", cs)
	}
}

// testCancelRequeue: an attempt whose cancel was requested and that the
// holder nacks with Requeue (an error retry, a not-run requeue) ends
// cancelled, never requeued; a Nack without Requeue still ends it as it
// says (dead here).
func testCancelRequeue(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	submitN(t, b, "rq", 2)
	m := claimOne(t, b, "w", "rq")
	cancel(t, b, m.ID)
	if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Requeue: true, NotRun: true, Delay: time.Minute, Error: "context canceled"}); err != nil {
		t.Fatalf("Nack{Requeue}: %v", err)
	}
	end := wantCancelled(t, b, m.ID, "context canceled")
	if end.Attempts != 1 {
		t.Fatalf("cancelled message has %d attempts, want 1 (the not-run requeue did not happen)", end.Attempts)
	}
	// The other one: a permanent failure wins over the request.
	m2 := claimOne(t, b, "w", "rq")
	cancel(t, b, m2.ID)
	if err := b.Nack(ctx, broker.NackRequest{Claim: m2.ClaimOf(), Error: "bad payload"}); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	dead := wantState(t, b, m2.ID, broker.StateDead)
	// Requeued by an operator, it runs again with no request pending: an
	// error retry requeues it.
	if err := b.Requeue(ctx, dead.ID); err != nil {
		t.Fatalf("Requeue: %v", err)
	}
	if again := wantState(t, b, m2.ID, broker.StateQueued); again.CancelRequestedAt != nil {
		t.Fatalf("requeued message keeps its old cancel request %v", again.CancelRequestedAt)
	}
	m3 := claimOne(t, b, "w", "rq")
	if err := b.Nack(ctx, broker.NackRequest{Claim: m3.ClaimOf(), Requeue: true, Error: "retry"}); err != nil {
		t.Fatalf("Nack{Requeue}: %v", err)
	}
	wantState(t, b, m2.ID, broker.StateQueued)
}

// testCancelStaleToken: a Nack{Cancel} naming an earlier claim of the
// message changes nothing and returns ErrClaimLost.
func testCancelStaleToken(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	submitN(t, b, "st", 1)
	old := claimOne(t, b, "w1", "st")
	if err := b.Nack(ctx, broker.NackRequest{Claim: old.ClaimOf(), Requeue: true, Error: "retry"}); err != nil {
		t.Fatal(err)
	}
	cur := claimOne(t, b, "w2", "st")
	cancel(t, b, cur.ID)
	wantErr(t, "Nack{Cancel} with a stale token", b.Nack(ctx, broker.NackRequest{Claim: old.ClaimOf(), Cancel: true}), broker.ErrClaimLost)
	wantErr(t, "Nack{Cancel} with no token", b.Nack(ctx, broker.NackRequest{Claim: broker.Claim{ID: cur.ID}, Cancel: true}), broker.ErrClaimLost)
	m := wantState(t, b, cur.ID, broker.StateRunning)
	if m.ClaimedBy != "w2" || m.Attempts != 2 {
		t.Fatalf("after the stale nack: claimed by %q, %d attempts; want w2's second attempt", m.ClaimedBy, m.Attempts)
	}
	if cs := cancelRequests(t, b, "w2"); !slices.Equal(cs, []broker.Claim{cur.ClaimOf()}) {
		t.Fatalf("CancelRequests(w2) = %v, want the current claim", cs)
	}
	if err := b.Nack(ctx, broker.NackRequest{Claim: cur.ClaimOf(), Cancel: true}); err != nil {
		t.Fatalf("Nack{Cancel} with the current token: %v", err)
	}
	wantCancelled(t, b, cur.ID, broker.CancelledError)
}

// testCancelFinished: a finished message (done, failed, dead) is returned
// unchanged with ErrFinished naming its state; an unknown id is
// ErrNotFound.
func testCancelFinished(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	setTopic(t, b, "nf", broker.TopicPatch{DeadLetterEnabled: ptr(false)})
	submitN(t, b, "fin", 2)
	submitN(t, b, "nf", 1)
	done := claimOne(t, b, "w", "fin")
	ack(t, b, done.ClaimOf(), "")
	dead := claimOne(t, b, "w", "fin")
	if err := b.DeadLetter(ctx, dead.ClaimOf(), "poison", nil); err != nil {
		t.Fatal(err)
	}
	failed := claimOne(t, b, "w", "nf")
	if err := b.Nack(ctx, broker.NackRequest{Claim: failed.ClaimOf(), Error: "boom"}); err != nil {
		t.Fatal(err)
	}
	for id, state := range map[int64]string{done.ID: broker.StateDone, dead.ID: broker.StateDead, failed.ID: broker.StateFailed} {
		before := get(t, b, id)
		m, err := b.Cancel(ctx, id)
		if !errors.Is(err, broker.ErrFinished) || !strings.Contains(err.Error(), state) {
			t.Fatalf("Cancel of a %s message: %v, want ErrFinished naming %s", state, err, state)
		}
		if m.ID != id || m.State != state {
			t.Fatalf("Cancel of a %s message returned %d %s", state, m.ID, m.State)
		}
		after := get(t, b, id)
		if after.State != state || after.LastError != before.LastError || after.CancelRequestedAt != nil {
			t.Fatalf("Cancel changed the %s message: %+v", state, after)
		}
	}
	_, err := b.Cancel(ctx, 1<<40)
	wantErr(t, "Cancel of an unknown id", err, broker.ErrNotFound)
}

// testCancelQueuedFilter: CancelQueued cancels the queued messages of a
// topic, a task, or both, and counts them; running ones and others stay;
// an empty filter is invalid and changes nothing.
func testCancelQueuedFilter(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	sub := func(topic, task string, n int) []int64 {
		var out []int64
		for range n {
			out = append(out, submit(t, b, broker.SubmitRequest{Topic: topic, Task: task}))
		}
		return out
	}
	ax := sub("fa", "x", 3)
	ay := sub("fa", "y", 2)
	bx := sub("fb", "x", 2)
	by := sub("fb", "y", 1)
	delayed := submit(t, b, broker.SubmitRequest{Topic: "fb", Task: "x", Delay: time.Hour})
	running := claimOne(t, b, "w", "fa") // ax[0]

	for _, f := range []broker.CancelFilter{{}, {Topic: strings.Repeat("t", broker.MaxTopicLen+1)}, {Task: strings.Repeat("k", broker.MaxTaskLen+1)}} {
		n, err := b.CancelQueued(ctx, f)
		if !errors.Is(err, broker.ErrInvalid) || n != 0 {
			t.Fatalf("CancelQueued(%+v) = %d, %v; want ErrInvalid", f, n, err)
		}
	}
	if got := list(t, b, broker.MessageFilter{State: broker.StateCancelled}); len(got) != 0 {
		t.Fatalf("refused filters cancelled %v", ids(got))
	}

	count := func(f broker.CancelFilter, want int) {
		t.Helper()
		n, err := b.CancelQueued(ctx, f)
		if err != nil || n != want {
			t.Fatalf("CancelQueued(%+v) = %d, %v; want %d", f, n, err, want)
		}
	}
	count(broker.CancelFilter{Topic: "fb", Task: "x"}, 3) // bx and the delayed one
	count(broker.CancelFilter{Task: "y"}, 3)              // ay and by
	count(broker.CancelFilter{Topic: "fa"}, 2)            // ax but the running one
	count(broker.CancelFilter{Topic: "fa"}, 0)
	count(broker.CancelFilter{Topic: "nowhere"}, 0)

	for _, id := range slices.Concat(ax[1:], ay, bx, by, []int64{delayed}) {
		wantCancelled(t, b, id, broker.CancelledError)
	}
	if m := wantState(t, b, running.ID, broker.StateRunning); m.CancelRequestedAt != nil {
		t.Fatal("CancelQueued requested the cancel of a running message")
	}
	claimNone(t, b, "fa", "fb")
}

// testCancelRacingClaim: cancels racing claims end each message in
// exactly one of the two: cancelled and never claimed, or claimed and
// running with its cancel requested.
func testCancelRacingClaim(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	const n = 16
	ids := submitN(t, b, "race", n)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		claimed = map[int64]bool{}
		results = make([]broker.Message, n)
		errs    = make([]error, n)
	)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n / 2 {
				ms, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"race"}, Max: 3})
				if err != nil {
					t.Errorf("Claim %d: %v", w, err)
					return
				}
				mu.Lock()
				for _, m := range ms {
					claimed[m.ID] = true
				}
				mu.Unlock()
			}
		}()
	}
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = b.Cancel(ctx, ids[i])
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for i, id := range ids {
		if errs[i] != nil {
			t.Fatalf("Cancel(%d): %v", id, errs[i])
		}
		m := get(t, b, id)
		switch results[i].State {
		case broker.StateCancelled:
			if claimed[id] || m.State != broker.StateCancelled {
				t.Fatalf("message %d: Cancel said cancelled, but it was claimed %v, is %s", id, claimed[id], m.State)
			}
		case broker.StateRunning:
			if !claimed[id] || m.State != broker.StateRunning || m.CancelRequestedAt == nil {
				t.Fatalf("message %d: Cancel said running, but claimed %v, is %s, requested at %v", id, claimed[id], m.State, m.CancelRequestedAt)
			}
		default:
			t.Fatalf("message %d: Cancel returned state %s", id, results[i].State)
		}
	}
	// What was claimed is exactly what was asked to stop.
	var want []broker.Claim
	cs := cancelRequests(t, b, "w")
	for _, c := range cs {
		want = append(want, c)
		if !claimed[c.ID] {
			t.Fatalf("cancel request for %d, which was never claimed", c.ID)
		}
	}
	if len(want) != len(claimed) {
		t.Fatalf("%d cancel requests, %d claimed", len(want), len(claimed))
	}
}

// testCancelNackRacingAck: the holder's Ack and its Nack{Cancel}, sent at
// once with the same valid token (a task that finished as its cancel came
// in), end each message in exactly one of the two: the write that won
// returns nil and decides the state, the other returns ErrClaimLost.
func testCancelNackRacingAck(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	const n = 10
	submitN(t, b, "na", n)
	ms := claim(t, b, "w", n, "na")
	if len(ms) != n {
		t.Fatalf("claimed %d, want %d", len(ms), n)
	}
	for _, m := range ms {
		cancel(t, b, m.ID)
	}
	ackErrs := make([]error, n)
	nackErrs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs, err := b.Ack(ctx, []broker.Outcome{{Claim: m.ClaimOf()}})
			if err == nil {
				err = errs[0]
			}
			ackErrs[i] = err
		}()
		go func() {
			defer wg.Done()
			nackErrs[i] = b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Cancel: true})
		}()
	}
	wg.Wait()
	for i, m := range ms {
		got := get(t, b, m.ID)
		switch {
		case ackErrs[i] == nil && errors.Is(nackErrs[i], broker.ErrClaimLost):
			if got.State != broker.StateDone {
				t.Fatalf("message %d: the ack won, but it is %s", m.ID, got.State)
			}
		case nackErrs[i] == nil && errors.Is(ackErrs[i], broker.ErrClaimLost):
			if got.State != broker.StateCancelled {
				t.Fatalf("message %d: the cancel won, but it is %s", m.ID, got.State)
			}
		default:
			t.Fatalf("message %d: ack %v, nack{cancel} %v; want exactly one to win", m.ID, ackErrs[i], nackErrs[i])
		}
	}
}

// testReclaimCancelRequested: the reaper ends an orphan whose cancel was
// requested cancelled (a suspect, its last error saying why), and
// requeues the other orphans of the same pass as before.
func testReclaimCancelRequested(t *testing.T, s Store) {
	b := s.Broker
	ctx := ctxOf(t)
	const grace = time.Minute
	register(t, b, "alive", "gone")
	submitN(t, b, "rc", 2)
	asked := claimOne(t, b, "gone", "rc")
	other := claimOne(t, b, "gone", "rc")
	acquire(t, b, "rc-lock", "gone", asked.ClaimOf())
	cancel(t, b, asked.ID)
	s.AgeClaim(t, asked.ID, 2*grace)
	s.AgeClaim(t, other.ID, 2*grace)

	res, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"alive"}, Grace: grace, MaxAttempts: 3})
	if err != nil {
		t.Fatalf("ReclaimOrphans: %v", err)
	}
	if res.Cancelled != 1 || res.Reclaimed != 1 || res.DeadLettered != 0 || res.LocksReleased != 1 ||
		!slices.Equal(res.IDs, []int64{asked.ID, other.ID}) {
		t.Fatalf("ReclaimOrphans = %+v; want one cancelled, one requeued, the lock released", res)
	}
	m := wantState(t, b, asked.ID, broker.StateCancelled)
	if !m.Suspect || m.FinishedAt == nil || !strings.HasPrefix(m.LastError, broker.OrphanedErrorPrefix) || !strings.Contains(m.LastError, "cancel") {
		t.Fatalf("reclaimed cancel-requested orphan: %+v; want a finished suspect whose last error says it was cancelled", m)
	}
	wantState(t, b, other.ID, broker.StateQueued)
	wantErr(t, "Nack{Cancel} after the reclaim", b.Nack(ctx, broker.NackRequest{Claim: asked.ClaimOf(), Cancel: true}), broker.ErrClaimLost)
	if got := claimOne(t, b, "alive", "rc"); got.ID != other.ID {
		t.Fatalf("claimed %d, want the requeued %d", got.ID, other.ID)
	}
}
