package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/internal/testdb"
)

// sameSchemaBroker opens another broker on b's schema: another process's
// view of the same tables, with its own connections and claim state.
func sameSchemaBroker(t *testing.T, b *Broker) *Broker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o, err := New(ctx, Options{DSN: testdb.DSN(), Schema: b.schema})
	if err != nil {
		t.Fatalf("New on schema %s: %v", b.schema, err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// claimAll has every broker of bs claim and ack from topic in perBroker
// goroutines until, once submitting is closed, three claims of each come
// back empty, and returns how many times each message was claimed.
func claimAll(t *testing.T, bs []*Broker, topic string, perBroker, max int, submitting <-chan struct{}) map[int64]int {
	t.Helper()
	var (
		mu     sync.Mutex
		claims = map[int64]int{}
		wg     sync.WaitGroup
	)
	errc := make(chan error, len(bs)*perBroker)
	for i, b := range bs {
		for w := range perBroker {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				req := broker.ClaimRequest{WorkerID: fmt.Sprintf("w%d-%d", i, w), Topics: []string{topic}, Max: max}
				for empty := 0; empty < 3; {
					msgs, err := b.Claim(ctx, req)
					if err != nil {
						errc <- err
						return
					}
					if len(msgs) == 0 {
						select {
						case <-submitting:
							empty++
						default:
						}
						time.Sleep(5 * time.Millisecond)
						continue
					}
					empty = 0
					outcomes := make([]broker.Outcome, len(msgs))
					mu.Lock()
					for j, m := range msgs {
						claims[m.ID]++
						outcomes[j] = broker.Outcome{Claim: m.ClaimOf()}
					}
					mu.Unlock()
					errs, err := b.Ack(ctx, outcomes)
					if err != nil {
						errc <- err
						return
					}
					for j, e := range errs {
						if e != nil {
							errc <- fmt.Errorf("ack of message %d: %w", msgs[j].ID, e)
							return
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Errorf("claim or ack: %v", err)
	}
	if t.Failed() {
		t.FailNow()
	}
	return claims
}

// Every claim serialises on the topic lock, whatever the topic's limit,
// and writes no message row (claims.go). When the limit is lifted while
// claimers in several brokers run, they still never take a message twice,
// and the next claim learns the topic is unlimited.
func TestSerialClaimAfterTheLimitIsLifted(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	bs := []*Broker{b, sameSchemaBroker(t, b), sameSchemaBroker(t, b)}
	limit := 3
	if _, err := b.SetTopic(ctx, "t", broker.TopicPatch{ConcurrencyLimit: &limit}); err != nil {
		t.Fatal(err)
	}
	submitN(t, b, "t", 600)
	for _, o := range bs {
		msgs, err := o.Claim(ctx, broker.ClaimRequest{WorkerID: "first", Topics: []string{"t"}, Max: 1})
		if err != nil || len(msgs) != 1 {
			t.Fatalf("first claim: %d messages, %v", len(msgs), err)
		}
		if errs, err := o.Ack(ctx, []broker.Outcome{{Claim: msgs[0].ClaimOf()}}); err != nil || errs[0] != nil {
			t.Fatalf("first ack: %v %v", errs, err)
		}
		if !o.floors.isLimited("t") {
			t.Fatal("a claim of a limited topic did not note it limited: the test would not test the change")
		}
	}
	unlimited := 0
	if _, err := b.SetTopic(ctx, "t", broker.TopicPatch{ConcurrencyLimit: &unlimited}); err != nil {
		t.Fatal(err)
	}

	submitted := make(chan struct{})
	close(submitted)
	claims := claimAll(t, bs, "t", 4, 7, submitted)
	for id, n := range claims {
		if n != 1 {
			t.Errorf("message %d claimed %d times", id, n)
		}
	}
	if len(claims) != 600-len(bs) {
		t.Fatalf("%d messages claimed after the limit was lifted, want %d", len(claims), 600-len(bs))
	}
	for _, o := range bs {
		if o.floors.isLimited("t") {
			t.Error("claims of an unlimited topic still note it limited")
		}
	}
}

// Purge deletes a limited topic's queued messages while claimers of
// several brokers claim from it: nothing fails (no deadlock between the
// claims' row writes and the purge's deletes), no message is claimed twice,
// and every message ends done or purged.
func TestPurgeDuringSerialClaims(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	bs := []*Broker{b, sameSchemaBroker(t, b)}
	limit := 20
	if _, err := b.SetTopic(ctx, "t", broker.TopicPatch{ConcurrencyLimit: &limit}); err != nil {
		t.Fatal(err)
	}
	const rounds, perRound = 5, 400
	submitN(t, b, "t", perRound)

	purged := 0
	done, submitted := make(chan struct{}), make(chan struct{})
	var claims map[int64]int
	go func() {
		defer close(done)
		claims = claimAll(t, bs, "t", 3, 10, submitted)
	}()
	for range rounds - 1 {
		time.Sleep(20 * time.Millisecond)
		res, err := b.Purge(ctx, "t", false)
		if err != nil {
			t.Fatalf("purge: %v", err)
		}
		purged += res.Queued
		submitN(t, b, "t", perRound)
	}
	close(submitted)
	<-done
	for id, n := range claims {
		if n != 1 {
			t.Errorf("message %d claimed %d times", id, n)
		}
	}
	st, err := b.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range st.Topics {
		if ts.Name == "t" && (ts.Queued != 0 || ts.Running != 0) {
			t.Fatalf("left behind: %d queued, %d running", ts.Queued, ts.Running)
		}
	}
	if purged == 0 {
		t.Log("no purge found a queued message: the claimers were faster than the purges")
	}
	if got := len(claims) + purged; got != rounds*perRound {
		t.Fatalf("%d claimed + %d purged = %d, want the %d submitted", len(claims), purged, got, rounds*perRound)
	}
}

// TestAClaimWhoseTopicAppearedAfterItsLockClaimsNothing: a claim's lock
// statement found no row of its topic (the topic's first submit had not
// committed), and the submit commits before the claim statement reads
// the queue. The claim must take nothing: it holds no lock, so a cancel
// running beside it would end a message it takes as queued, and its
// worker would run a task whose cancel was answered "it never runs".
func TestAClaimWhoseTopicAppearedAfterItsLockClaimsNothing(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	// The submit starts first (its message is available from its start)
	// and commits between the claim's two statements.
	sub, err := schemaConn(t, b).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Rollback(ctx)
	var id int64
	if err := sub.QueryRow(ctx, `WITH t AS (INSERT INTO tw_topics (name) VALUES ('fresh') ON CONFLICT DO NOTHING)
		INSERT INTO tw_messages (topic, task) VALUES ('fresh', 't') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	tx, err := schemaConn(t, b).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, serialLockSQL, "fresh"); err != nil {
		t.Fatal(err)
	}
	if err := sub.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, claimSQL, "fresh", 10, "w")
	if err != nil {
		t.Fatal(err)
	}
	var took []int64
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		if vals[0] != nil {
			took = append(took, vals[0].(int64))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	m, err := b.Cancel(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if len(took) > 0 {
		t.Errorf("a claim without its topic's lock took %v; the cancel beside it ended message %d %s", took, id, m.State)
	}
	if m.State != broker.StateCancelled {
		t.Errorf("message %d, queued and not claimed, is %s after its cancel; want cancelled", id, m.State)
	}
}
