package postgres

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// claimRows returns the ids each claim row holds, by claim row id.
func claimRows(t *testing.T, c *pgx.Conn) map[int64][]int64 {
	t.Helper()
	rows, err := c.Query(t.Context(), `SELECT id, ids FROM tw_claims ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64][]int64{}
	for rows.Next() {
		var id int64
		var ids []int64
		if err := rows.Scan(&id, &ids); err != nil {
			t.Fatal(err)
		}
		out[id] = ids
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// withMessages is a broker on a schema of its own, a connection to that
// schema, and n messages submitted to topic t.
func withMessages(t *testing.T, n int) (*Broker, *pgx.Conn) {
	t.Helper()
	b := newTestBroker(t, Options{})
	c := schemaConn(t, b)
	submitN(t, b, "t", n)
	return b, c
}

// mustClaim claims n messages of topic t for worker, failing the test
// unless it gets exactly n.
func mustClaim(t *testing.T, b *Broker, worker string, n int) []broker.Message {
	t.Helper()
	msgs, err := b.Claim(t.Context(), broker.ClaimRequest{WorkerID: worker, Topics: []string{"t"}, Max: n})
	if err != nil || len(msgs) != n {
		t.Fatalf("claim for %s: %d messages, %v; want %d", worker, len(msgs), err, n)
	}
	return msgs
}

// A claim writes one claim row and leaves the messages' rows as they
// were; readers see the messages running under it, and each outcome takes
// its message out of the row. The row, left empty by the last, is what
// the next claim of the topic writes into.
func TestClaimWritesOneClaimRow(t *testing.T) {
	b, c := withMessages(t, 3)
	ctx := t.Context()
	var before []string
	if err := c.QueryRow(ctx, `SELECT array_agg(xmin::text ORDER BY id) FROM tw_messages`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 3})
	if err != nil || len(msgs) != 3 {
		t.Fatalf("claim: %d messages, %v", len(msgs), err)
	}
	var after []string
	if err := c.QueryRow(ctx, `SELECT array_agg(xmin::text ORDER BY id) FROM tw_messages`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(before, after) {
		t.Fatalf("the claim wrote message rows: xmin %v, then %v", before, after)
	}
	claims := claimRows(t, c)
	if len(claims) != 1 {
		t.Fatalf("claim rows %v, want one", claims)
	}
	for _, m := range msgs {
		if m.State != broker.StateRunning || m.Attempts != 1 || m.ClaimedBy != "w" || m.Token == "" {
			t.Fatalf("claimed %+v, want running, attempt 1, by w, with a token", m)
		}
		// Its outcomes lock the claim row: the pool groups them by it.
		if _, ok := claims[m.ClaimGroup]; !ok {
			t.Fatalf("message %d names claim group %d, want the claim row of %v", m.ID, m.ClaimGroup, claims)
		}
		got, err := b.GetMessage(ctx, m.ID)
		if err != nil || got.State != broker.StateRunning || got.Attempts != 1 || got.ClaimedBy != "w" ||
			got.ClaimedAt == nil || m.ClaimedAt == nil || !got.ClaimedAt.Equal(*m.ClaimedAt) {
			t.Fatalf("GetMessage(%d) = %+v, %v; want it running, attempt 1, by w at %v", m.ID, got, err, m.ClaimedAt)
		}
	}
	running, err := b.ListMessages(ctx, broker.MessageFilter{State: broker.StateRunning})
	if err != nil || len(running) != 3 {
		t.Fatalf("running list: %d, %v; want 3", len(running), err)
	}
	if queued, err := b.ListMessages(ctx, broker.MessageFilter{State: broker.StateQueued}); err != nil || len(queued) != 0 {
		t.Fatalf("queued list: %d, %v; want none", len(queued), err)
	}
	st, err := b.Stats(ctx)
	if err != nil || len(st.Topics) != 1 || st.Topics[0].Running != 3 || st.Topics[0].Queued != 0 {
		t.Fatalf("stats %+v, %v; want 3 running, 0 queued", st.Topics, err)
	}

	// One outcome of each kind: the row keeps the others.
	if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: msgs[0].ClaimOf()}}); err != nil || errs[0] != nil {
		t.Fatalf("ack: %v %v", errs, err)
	}
	for _, ids := range claimRows(t, c) {
		if !slices.Equal(ids, []int64{msgs[1].ID, msgs[2].ID}) {
			t.Fatalf("after the ack the claim holds %v, want %d and %d", ids, msgs[1].ID, msgs[2].ID)
		}
	}
	if err := b.Nack(ctx, broker.NackRequest{Claim: msgs[1].ClaimOf(), Requeue: true, Error: "again"}); err != nil {
		t.Fatal(err)
	}
	got, err := b.GetMessage(ctx, msgs[1].ID)
	if err != nil || got.State != broker.StateQueued || got.Attempts != 1 || got.LastError != "again" {
		t.Fatalf("after the nack: %+v, %v; want queued, its attempt counted", got, err)
	}
	if err := b.DeadLetter(ctx, msgs[2].ClaimOf(), "poison", nil); err != nil {
		t.Fatal(err)
	}
	claims = claimRows(t, c)
	var emptied int64
	for id, ids := range claims {
		if len(claims) != 1 || len(ids) != 0 {
			t.Fatalf("claim rows after every outcome: %v, want one, holding nothing", claims)
		}
		emptied = id
	}
	got, err = b.GetMessage(ctx, msgs[2].ID)
	if err != nil || got.State != broker.StateDead || got.Attempts != 1 || got.ClaimedBy != "w" {
		t.Fatalf("dead letter: %+v, %v; want dead, attempt 1, by w", got, err)
	}
	// A second outcome under a token that was used is refused.
	for _, m := range msgs {
		if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: m.ClaimOf()}}); err != nil || !errors.Is(errs[0], broker.ErrClaimLost) {
			t.Fatalf("second ack of %d: %v %v; want ErrClaimLost", m.ID, errs, err)
		}
	}
	again, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w2", Topics: []string{"t"}, Max: 3})
	if err != nil || len(again) != 1 || again[0].ID != msgs[1].ID || again[0].Attempts != 2 {
		t.Fatalf("claim after the requeue: %+v, %v; want message %d at attempt 2", again, err, msgs[1].ID)
	}
	if again[0].Token == msgs[1].Token {
		t.Fatal("a message claimed again got the token of its earlier claim")
	}
	if claims := claimRows(t, c); len(claims) != 1 || !slices.Equal(claims[emptied], []int64{msgs[1].ID}) {
		t.Fatalf("claim rows after the claim again: %v; want row %d reused, holding %d", claims, emptied, msgs[1].ID)
	}
	// The earlier tokens name the reused row but not its new key.
	for _, m := range msgs {
		if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: m.ClaimOf()}}); err != nil || !errors.Is(errs[0], broker.ErrClaimLost) {
			t.Fatalf("ack of %d under its first claim after the row was reused: %v %v; want ErrClaimLost", m.ID, errs, err)
		}
	}
	if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: again[0].ClaimOf()}}); err != nil || errs[0] != nil {
		t.Fatalf("ack under the reused row: %v %v", errs, err)
	}
}

// TestClaimTokensFormattedInGoMatchSQL: the token a claim formats from the
// halves its statement returns (formatClaimToken) is the one the SQL
// expression makes (claimToken), which the readers and the reaper use.
func TestClaimTokensFormattedInGoMatchSQL(t *testing.T) {
	_, c := withMessages(t, 1)
	cases := [][3]int64{{1, 0, 1}, {42, 0x0123456789abcdef, 7}, {1 << 40, -1, 1}, {math.MaxInt64, math.MinInt64, math.MaxInt64},
		{977, -0x5ca1ab1e, 123456789}}
	for _, tc := range cases {
		cid, key, id := tc[0], tc[1], tc[2]
		var want string
		if err := c.QueryRow(t.Context(), `SELECT `+claimToken("c", "$3::bigint")+` FROM (SELECT $1::bigint AS id, $2::bigint AS key) c`,
			cid, key, id).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if got := formatClaimToken(cid, key^id); got != want {
			t.Fatalf("claim row %d, key %d, message %d: token %q, SQL makes %q", cid, key, id, got, want)
		}
		if gc, gk := parseClaimToken(want); gc != cid || gk != key^id {
			t.Fatalf("parseClaimToken(%q) = %d, %d; want %d, %d", want, gc, gk, cid, key^id)
		}
	}
}

// Claims and acks of a topic, one after the other, keep writing the same
// claim row: the table does not grow with the claims made, whether or
// not anything vacuums it.
func TestClaimRowsAreReused(t *testing.T) {
	b, c := withMessages(t, 200)
	ctx := t.Context()
	for i := range 100 {
		msgs := mustClaim(t, b, "w", 2)
		errs, err := b.Ack(ctx, []broker.Outcome{{Claim: msgs[0].ClaimOf()}, {Claim: msgs[1].ClaimOf()}})
		if err != nil || errs[0] != nil || errs[1] != nil {
			t.Fatalf("ack %d: %v %v", i, errs, err)
		}
	}
	// The sequence of claim row ids counts the rows ever inserted.
	var rows, inserted int64
	if err := c.QueryRow(ctx, `SELECT (SELECT count(*) FROM tw_claims), last_value FROM tw_claims_id_seq`).Scan(&rows, &inserted); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || inserted != 1 {
		t.Fatalf("after 100 claims: %d claim rows, %d inserted; want the one row, written over", rows, inserted)
	}
}

// The reaper takes a dead worker's claim row back whole, with what its
// outcomes left in it, counting the attempt; a late outcome under it is
// refused.
func TestReclaimTakesBackAClaimRow(t *testing.T) {
	b, c := withMessages(t, 3)
	ctx := t.Context()
	msgs := mustClaim(t, b, "dead", 3)
	if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: msgs[0].ClaimOf()}}); err != nil || errs[0] != nil {
		t.Fatalf("ack: %v %v", errs, err)
	}
	execAll(t, c, `UPDATE tw_claims SET claimed_at = now() - interval '10 minutes'`)
	res, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"alive"}, Grace: time.Minute, MaxAttempts: 3})
	if err != nil || res.Reclaimed != 2 || !slices.Equal(res.IDs, []int64{msgs[1].ID, msgs[2].ID}) {
		t.Fatalf("ReclaimOrphans = %+v, %v; want %d and %d reclaimed", res, err, msgs[1].ID, msgs[2].ID)
	}
	if claims := claimRows(t, c); len(claims) != 0 {
		t.Fatalf("claim rows after the reclaim: %v, want none", claims)
	}
	for _, m := range msgs[1:] {
		got, err := b.GetMessage(ctx, m.ID)
		if err != nil || got.State != broker.StateQueued || got.Attempts != 1 || !got.Suspect {
			t.Fatalf("reclaimed %+v, %v; want queued, suspect, attempt 1 counted", got, err)
		}
		if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: m.ClaimOf()}}); err != nil || !errors.Is(errs[0], broker.ErrClaimLost) {
			t.Fatalf("late ack of %d: %v %v; want ErrClaimLost", m.ID, errs, err)
		}
	}
}

// A token that is not a claim's token, or names a claim row that does not
// hold the message, changes nothing and fails nothing else in its batch.
func TestForeignTokensAreRefused(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	submitN(t, b, "t", 2)
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 2})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("claim: %d messages, %v", len(msgs), err)
	}
	outcomes := []broker.Outcome{
		{Claim: broker.Claim{ID: msgs[0].ID, Token: "not a token"}},
		// msgs[1]'s token names the right claim row but another message.
		{Claim: broker.Claim{ID: msgs[0].ID, Token: msgs[1].Token}},
		{Claim: msgs[1].ClaimOf()},
	}
	errs, err := b.Ack(ctx, outcomes)
	if err != nil || !errors.Is(errs[0], broker.ErrClaimLost) || !errors.Is(errs[1], broker.ErrClaimLost) || errs[2] != nil {
		t.Fatalf("ack = %v, %v; want the two foreign tokens lost and the last applied", errs, err)
	}
	got, err := b.GetMessage(ctx, msgs[0].ID)
	if err != nil || got.State != broker.StateRunning {
		t.Fatalf("message %d after foreign tokens: %+v, %v; want it still running", msgs[0].ID, got, err)
	}
	if err := b.Nack(ctx, broker.NackRequest{Claim: broker.Claim{ID: msgs[0].ID, Token: "zz"}}); !errors.Is(err, broker.ErrClaimLost) {
		t.Fatalf("nack under a foreign token: %v, want ErrClaimLost", err)
	}
}

// Cancels of queued messages and claims of their topic, racing, one by
// one (Cancel) and all at once (CancelQueued): a message either ends
// cancelled without running, or runs with a cancel request; it never runs
// after it was cancelled.
func TestCancelRacingClaims(t *testing.T) {
	raceCancelsWithClaims(t, false, func(ctx context.Context, b *Broker, ids []int64) {
		for _, id := range ids {
			if _, err := b.Cancel(ctx, id); err != nil && !errors.Is(err, broker.ErrFinished) {
				t.Errorf("cancel %d: %v", id, err)
				return
			}
		}
	})
}

func TestCancelQueuedRacingClaims(t *testing.T) {
	raceCancelsWithClaims(t, true, func(ctx context.Context, b *Broker, ids []int64) {
		for {
			n, err := b.CancelQueued(ctx, broker.CancelFilter{Topic: "t"})
			if err != nil {
				t.Errorf("cancel queued: %v", err)
				return
			}
			if n == 0 {
				return
			}
		}
	})
}

// raceCancelsWithClaims submits messages, runs cancelAll over them (the
// ids oldest first) while a claimer takes them, oldest first (once its
// first claim returned, with afterFirst: a cancel of them all at once
// would otherwise come first), and checks that every message claimed is
// still running (with a cancel request), the others cancelled.
func raceCancelsWithClaims(t *testing.T, afterFirst bool, cancelAll func(ctx context.Context, b *Broker, ids []int64)) {
	b := newTestBroker(t, Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const n = 200
	submitN(t, b, "t", n)
	ids := make([]int64, 0, n)
	all, err := b.ListMessages(ctx, broker.MessageFilter{Topic: "t", Limit: n})
	if err != nil || len(all) != n {
		t.Fatalf("list: %d, %v", len(all), err)
	}
	for _, m := range all {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids) // oldest first, as the claims take them: they meet
	claimed, started := make(chan []broker.Message, 1), make(chan struct{})
	go func() {
		var got []broker.Message
		defer func() { claimed <- got }()
		for i := range n {
			msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 3})
			if i == 0 {
				close(started)
			}
			if err != nil {
				t.Errorf("claim: %v", err)
				return
			}
			got = append(got, msgs...)
			if len(msgs) == 0 {
				return
			}
		}
	}()
	if afterFirst {
		<-started
	}
	cancelAll(ctx, b, ids)
	got := <-claimed
	if t.Failed() {
		t.FailNow()
	}
	cancelled := 0
	for _, id := range ids {
		m, err := b.GetMessage(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if m.State == broker.StateCancelled {
			cancelled++
		}
	}
	for _, m := range got {
		now, err := b.GetMessage(ctx, m.ID)
		if err != nil {
			t.Fatal(err)
		}
		if now.State != broker.StateRunning {
			t.Errorf("message %d was claimed and is now %s: a cancelled message ran", m.ID, now.State)
		}
	}
	if cancelled+len(got) != n {
		t.Errorf("%d cancelled and %d claimed of %d", cancelled, len(got), n)
	}
	t.Logf("%d of %d messages claimed before their cancel", len(got), n)
}

// Rows made running the old way (by the claims of an earlier version,
// still running at the upgrade, or by the rabbitmq broker's state store)
// read as running, end under their own tokens, and are reclaimed by the
// reaper, beside claim rows.
func TestRowsMadeRunningTheOldWayStillWork(t *testing.T) {
	b, c := withMessages(t, 3)
	ctx := t.Context()
	var ids []int64
	rows, err := c.Query(ctx, `UPDATE tw_messages SET state = 'running', claimed_by = 'old', claimed_at = now(),
		attempts = 1, token = gen_random_uuid() WHERE id IN (SELECT id FROM tw_messages ORDER BY id LIMIT 2)
		RETURNING id`)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil || len(ids) != 2 {
		t.Fatalf("made %v running, %v", ids, err)
	}
	slices.Sort(ids)
	held, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "new", Topics: []string{"t"}, Max: 3})
	if err != nil || len(held) != 1 {
		t.Fatalf("claim beside the old rows: %d, %v; want the one queued", len(held), err)
	}
	claims, err := b.RunningClaims(ctx, "old")
	if err != nil || len(claims) != 2 {
		t.Fatalf("RunningClaims(old) = %v, %v; want the 2 old rows", claims, err)
	}
	st, err := b.Stats(ctx)
	if err != nil || st.Topics[0].Running != 3 || st.Topics[0].Queued != 0 {
		t.Fatalf("stats %+v, %v; want 3 running", st.Topics, err)
	}
	// One old row and the claim row's message acked in one batch.
	errs, err := b.Ack(ctx, []broker.Outcome{{Claim: claims[0]}, {Claim: held[0].ClaimOf()}})
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("ack: %v %v", errs, err)
	}
	got, err := b.GetMessage(ctx, claims[0].ID)
	if err != nil || got.State != broker.StateDone || got.Attempts != 1 || got.ClaimedBy != "old" {
		t.Fatalf("old row acked: %+v, %v; want done, attempt 1 (counted at its claim), by old", got, err)
	}
	execAll(t, c, `UPDATE tw_messages SET claimed_at = now() - interval '10 minutes' WHERE state = 'running'`)
	res, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"new"}, Grace: time.Minute, MaxAttempts: 3})
	if err != nil || res.Reclaimed != 1 || !slices.Equal(res.IDs, []int64{claims[1].ID}) {
		t.Fatalf("ReclaimOrphans = %+v, %v; want the other old row reclaimed", res, err)
	}
	if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: claims[1]}}); err != nil || !errors.Is(errs[0], broker.ErrClaimLost) {
		t.Fatalf("late ack of the reclaimed old row: %v %v; want ErrClaimLost", errs, err)
	}
}
