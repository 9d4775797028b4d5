package postgres

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/worker"
)

// notifyDeadline bounds the waits on a condition: generous, for a loaded
// 2-core machine, and far below the hour the pools here wait between
// polls.
const notifyDeadline = 60 * time.Second

// otherHost returns a second broker on b's schema, with its own
// connections, as another host's would be.
func otherHost(t *testing.T, b *Broker) *Broker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o, err := New(ctx, Options{DSN: testdb.DSN(), Schema: b.schema})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// runPool runs task "t" on topic "q" from b until the test ends.
func runPool(t *testing.T, b broker.Broker, opts worker.Options) *worker.Pool {
	t.Helper()
	reg := worker.NewRegistry()
	reg.MustRegister(worker.Task{Name: "t", Topic: "q", Handler: func(context.Context, *worker.TaskContext) (any, error) {
		return "ok", nil
	}})
	opts.Logger = hclog.NewNullLogger()
	p := worker.NewPool(b, reg, opts)
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	return p
}

// waitFor polls cond until it holds, failing the test with what after
// notifyDeadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(notifyDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitMessageDone(t *testing.T, b *Broker, id int64) {
	t.Helper()
	waitFor(t, "message done", func() bool {
		m, err := b.GetMessage(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return m.State == broker.StateDone
	})
}

// rawInsert queues a message by SQL that sends no notification.
func rawInsert(t *testing.T, c *pgx.Conn, b *Broker) int64 {
	t.Helper()
	var id int64
	_, err := c.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{b.schema, "tw_topics"}.Sanitize()+
		` (name) VALUES ('q') ON CONFLICT DO NOTHING`)
	if err != nil {
		t.Fatal(err)
	}
	err = c.QueryRow(context.Background(), `INSERT INTO `+pgx.Identifier{b.schema, "tw_messages"}.Sanitize()+
		` (topic, task) VALUES ('q', 't') RETURNING id`).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestNotifyWakesAPoolOfAnotherHost(t *testing.T) {
	a := newTestBroker(t, Options{})
	b := otherHost(t, a)
	// Both waits an hour: only an announcement can make the pool claim.
	runPool(t, b, worker.Options{ClaimIdleInterval: time.Hour, ClaimIdleFallback: time.Hour})
	waitFor(t, "listening", b.listen.listening.Load)
	ctx := context.Background()
	for i := range 3 {
		id, err := a.Submit(ctx, broker.SubmitRequest{Topic: "q", Task: "t"})
		if err != nil {
			t.Fatal(err)
		}
		waitMessageDone(t, a, id)
		if i == 0 {
			ids, err := a.SubmitMany(ctx, []broker.SubmitRequest{{Topic: "q", Task: "t"}, {Topic: "q", Task: "t"}})
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				waitMessageDone(t, a, id)
			}
		}
	}
	// A delayed message is announced too: the pool claims it when due.
	id, err := a.Submit(ctx, broker.SubmitRequest{Topic: "q", Task: "t", Delay: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	waitMessageDone(t, a, id)
}

func TestNotifyChannelFitsPostgresNames(t *testing.T) {
	for _, schema := range []string{"", "public", "a123456789012345678901234567890123456789012345678901234567890bc"} {
		ch := NotifyChannel(schema)
		if len(ch) > 63 {
			t.Errorf("schema %q: channel %q is %d bytes", schema, ch, len(ch))
		}
	}
	long1 := "a123456789012345678901234567890123456789012345678901234567890bc"
	long2 := "a123456789012345678901234567890123456789012345678901234567890bd"
	if NotifyChannel(long1) == NotifyChannel(long2) {
		t.Error("two long schemas share a channel")
	}
	if NotifyChannel("") != "taskhost_public" {
		t.Errorf("default channel %q", NotifyChannel(""))
	}
}

func TestDroppedListenerPollsFastThenListensAgain(t *testing.T) {
	a := newTestBroker(t, Options{})
	b := otherHost(t, a)
	var refuse atomic.Bool
	b.listen.dial = func(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
		if refuse.Load() {
			return nil, errors.New("refused by the test")
		}
		return pgx.ConnectConfig(ctx, cfg)
	}
	runPool(t, b, worker.Options{ClaimIdleInterval: 20 * time.Millisecond, ClaimIdleFallback: time.Hour})
	waitFor(t, "listening", b.listen.listening.Load)
	pid := b.listen.pid.Load()

	// The listening connection dies and cannot come back for now.
	refuse.Store(true)
	admin := connect(t)
	if _, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, int32(pid)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "listening stops", func() bool { return !b.listen.listening.Load() })
	// Messages that nobody announces are claimed by the fast poll (the
	// fallback is an hour). The first may ride on the claim the lost
	// connection itself triggers; the second cannot.
	waitMessageDone(t, a, rawInsert(t, admin, a))
	waitMessageDone(t, a, rawInsert(t, admin, a))

	// The listener comes back on a new connection.
	refuse.Store(false)
	waitFor(t, "listening again", b.listen.listening.Load)
	if again := b.listen.pid.Load(); again == pid || again == 0 {
		t.Errorf("listening on pid %d again, was %d", again, pid)
	}
	id, err := a.Submit(context.Background(), broker.SubmitRequest{Topic: "q", Task: "t"})
	if err != nil {
		t.Fatal(err)
	}
	waitMessageDone(t, a, id)
}

func TestBrokerThatOnlySubmitsOpensNoListener(t *testing.T) {
	b := newTestBroker(t, Options{})
	if _, err := b.Submit(context.Background(), broker.SubmitRequest{Topic: "q", Task: "t"}); err != nil {
		t.Fatal(err)
	}
	b.listen.mu.Lock()
	started := b.listen.started
	b.listen.mu.Unlock()
	if started {
		t.Error("Submit started the listener")
	}
	s := b.Subscribe()
	waitFor(t, "listening", s.Listening)
	s.Close()
	s.Close()
	_ = b.Close()
	if s.Listening() {
		t.Error("listening after Close")
	}
}

func TestRetryIsAnnouncedWithItsBackoff(t *testing.T) {
	a := newTestBroker(t, Options{})
	b := otherHost(t, a)
	var tries atomic.Int32
	reg := worker.NewRegistry()
	reg.MustRegister(worker.Task{Name: "flaky", Topic: "q", MaxAttempts: 3, Handler: func(context.Context, *worker.TaskContext) (any, error) {
		if tries.Add(1) == 1 {
			return nil, worker.RetryAfter(errors.New("first try fails"), 200*time.Millisecond)
		}
		return "ok", nil
	}})
	// Both waits an hour: the retry runs only if its requeue is announced.
	p := worker.NewPool(b, reg, worker.Options{ClaimIdleInterval: time.Hour, ClaimIdleFallback: time.Hour, Logger: hclog.NewNullLogger()})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	waitFor(t, "listening", b.listen.listening.Load)
	id, err := a.Submit(context.Background(), broker.SubmitRequest{Topic: "q", Task: "flaky"})
	if err != nil {
		t.Fatal(err)
	}
	waitMessageDone(t, a, id)
	if n := tries.Load(); n != 2 {
		t.Errorf("%d tries, want 2", n)
	}
}

func TestQuietListenerPingsAndKeepsItsConnection(t *testing.T) {
	a := newTestBroker(t, Options{})
	b := otherHost(t, a)
	b.listen.pingAfter = 20 * time.Millisecond
	s := b.Subscribe()
	defer s.Close()
	waitFor(t, "listening", s.Listening)
	pid := b.listen.pid.Load()
	waitFor(t, "three pings", func() bool { return b.listen.pings.Load() >= 3 })
	if now := b.listen.pid.Load(); now != pid || !s.Listening() {
		t.Fatalf("after the pings: pid %d (was %d), listening %v", now, pid, s.Listening())
	}
	if _, err := a.Submit(context.Background(), broker.SubmitRequest{Topic: "quiet", Task: "t"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(notifyDeadline)
	for {
		select {
		case n := <-s.Notices():
			if n.Topic == "quiet" {
				return
			}
		case <-deadline:
			t.Fatal("no notice of the submit after the pings")
		}
	}
}

// A slot of a limited topic that another process frees is announced: a
// pool waiting for it claims at once, not at its fallback poll. Both ends
// of an attempt that free a slot are covered: an ack and a failure.
func TestFreedSlotOfALimitedTopicWakesAnotherHost(t *testing.T) {
	a := newTestBroker(t, Options{})
	b := otherHost(t, a)
	ctx := context.Background()
	one := 1
	if _, err := a.SetTopic(ctx, "q", broker.TopicPatch{ConcurrencyLimit: &one}); err != nil {
		t.Fatal(err)
	}
	for _, end := range []string{"ack", "nack"} {
		// Host a holds the topic's one slot.
		held, err := a.Submit(ctx, broker.SubmitRequest{Topic: "q", Task: "t"})
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := a.Claim(ctx, broker.ClaimRequest{WorkerID: "host-a", Topics: []string{"q"}, Max: 1})
		if err != nil || len(msgs) != 1 || msgs[0].ID != held {
			t.Fatalf("%s: host a claims %d: got %v, %v", end, held, msgs, err)
		}
		p := runPool(t, b, worker.Options{ClaimIdleInterval: time.Hour, ClaimIdleFallback: time.Hour})
		waitFor(t, "listening", b.listen.listening.Load)
		// Announced, but the topic is full: b's pool finds nothing to
		// claim and waits an hour unless told again.
		waiting, err := a.Submit(ctx, broker.SubmitRequest{Topic: "q", Task: "t"})
		if err != nil {
			t.Fatal(err)
		}
		claim := broker.Claim{ID: msgs[0].ID, Token: msgs[0].Token}
		if end == "ack" {
			errs, err := a.Ack(ctx, []broker.Outcome{{Claim: claim}})
			if err != nil || errs[0] != nil {
				t.Fatalf("ack: %v %v", errs, err)
			}
		} else if err := a.Nack(ctx, broker.NackRequest{Claim: claim, Error: "boom"}); err != nil {
			t.Fatalf("nack: %v", err)
		}
		waitMessageDone(t, a, waiting)
		if err := p.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// The messages the reaper requeues are announced: a pool of another
// process claims them at once, not at its fallback poll.
func TestReclaimedMessagesAreAnnounced(t *testing.T) {
	a := newTestBroker(t, Options{})
	b := otherHost(t, a)
	ctx := context.Background()
	id, err := a.Submit(ctx, broker.SubmitRequest{Topic: "q", Task: "t"})
	if err != nil {
		t.Fatal(err)
	}
	// A worker that then dies holds it.
	msgs, err := a.Claim(ctx, broker.ClaimRequest{WorkerID: "dead-worker", Topics: []string{"q"}, Max: 1})
	if err != nil || len(msgs) != 1 || msgs[0].ID != id {
		t.Fatalf("claim %d: got %v, %v", id, msgs, err)
	}
	runPool(t, b, worker.Options{ClaimIdleInterval: time.Hour, ClaimIdleFallback: time.Hour})
	waitFor(t, "listening", b.listen.listening.Load)
	res, err := a.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"some-live-worker"}})
	if err != nil || res.Reclaimed != 1 {
		t.Fatalf("reclaim: %+v, %v", res, err)
	}
	waitMessageDone(t, a, id)
}
