package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/client"
	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/internal/testhost"
)

// answerDropper is a TCP proxy to PostgreSQL that, while dropping, passes
// what its clients send and drops what the server answers, then resets the
// connection: a statement reaches the database, may commit, and its answer
// never comes back.
type answerDropper struct {
	ln       net.Listener
	target   string
	dropping atomic.Bool
	dropped  atomic.Int64 // connections cut after an answer was dropped

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func startAnswerDropper(t *testing.T, target string) *answerDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &answerDropper{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for c := range p.conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *answerDropper) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *answerDropper) serve(c net.Conn) {
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.track(c, true)
	p.track(up, true)
	reset := func() {
		for _, x := range []net.Conn{c, up} {
			if tc, ok := x.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			x.Close()
		}
	}
	defer func() {
		reset()
		p.track(c, false)
		p.track(up, false)
	}()
	go func() {
		_, _ = io.Copy(up, c)
		reset()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := up.Read(buf)
		if n > 0 && p.dropping.Load() {
			// The answer is lost; the connection dies a little later,
			// as a link that stopped carrying anything back is given up.
			p.dropped.Add(1)
			time.Sleep(100 * time.Millisecond)
			return
		}
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestClientWhileTheLinkToPostgreSQLDropsAnswers: a host's tasks_worker
// reaches PostgreSQL through a link that, now and then, loses what the
// database answers. Clients submit tasks, with and without unique keys,
// with the client's retries on. No task is ever stored twice, whatever
// the retries; a submit that returned an id stored that task once; one
// that failed said why: either that its outcome is unknown (the task may
// be stored, once at most) or an error of the host's that stored nothing.
func TestClientWhileTheLinkToPostgreSQLDropsAnswers(t *testing.T) {
	dsn, err := url.Parse(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	proxy := startAnswerDropper(t, dsn.Host)
	dsn.Host = proxy.ln.Addr().String()
	schema := testdb.FreshSchema(t, "tw_client_")
	db := testdb.Connect(t, schema)

	dir := t.TempDir()
	if err := testhost.Build(dir); err != nil {
		t.Fatal(err)
	}
	var log testhost.SyncBuffer
	base, stop, err := testhost.Start(dir, fmt.Sprintf(`plugins:
  tasks_worker:
    enabled: true
    config:
      broker: postgres
      dsn: %q
      schema: %s
      workers: 2
      topics: {held: {paused: true}}
`, dsn.String(), schema), &log)
	if err != nil {
		t.Fatalf("start a host: %v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("host log:\n%s", log.String())
		}
	})

	c := client.New(base, client.WithRetry(client.RetryPolicy{Attempts: 8, MinDelay: 50 * time.Millisecond, MaxDelay: time.Second}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := c.Submit(ctx, client.Task{Task: "demo.echo", Topic: "held", Payload: json.RawMessage(`{"n": 0}`)}); err != nil {
		t.Fatalf("a submit over a clean link: %v", err)
	}

	// The link drops answers for a while, again and again, while the
	// clients submit.
	flapping := make(chan struct{})
	go func() {
		defer close(flapping)
		for range 12 {
			proxy.dropping.Store(true)
			time.Sleep(300 * time.Millisecond)
			proxy.dropping.Store(false)
			time.Sleep(500 * time.Millisecond)
		}
	}()
	type outcome struct {
		n       int
		unique  bool
		id      string
		dup     bool
		err     error
		elapsed time.Duration
	}
	const clients = 6
	var (
		mu       sync.Mutex
		outcomes []outcome
		wg       sync.WaitGroup
		next     atomic.Int64
	)
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-flapping:
					return
				default:
				}
				n := int(next.Add(1))
				task := client.Task{Task: "demo.echo", Topic: "held", Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, n))}
				unique := n%2 == 0
				if unique {
					task.UniqueKey = fmt.Sprintf("dropped-%d", n)
				}
				began := time.Now()
				id, dup, err := c.SubmitUnique(ctx, task)
				mu.Lock()
				outcomes = append(outcomes, outcome{n, unique, id, dup, err, time.Since(began)})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if proxy.dropped.Load() == 0 {
		t.Fatal("no answer was dropped: the test did not test")
	}

	stored := map[int][]string{}
	rows, err := db.Query(ctx, `SELECT (payload->>'n')::int, id::text FROM tw_messages_all ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n int
		var id string
		if err := rows.Scan(&n, &id); err != nil {
			t.Fatal(err)
		}
		stored[n] = append(stored[n], id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	tally := map[string]int{}
	for _, o := range outcomes {
		kind := "plain"
		if o.unique {
			kind = "unique"
		}
		ids := stored[o.n]
		if len(ids) > 1 {
			t.Errorf("submit %d (%s) is stored %d times: %v (the client answered %q, %v)", o.n, kind, len(ids), ids, o.id, o.err)
		}
		var ae *client.APIError
		switch {
		case o.err == nil:
			tally[kind+": stored"]++
			if len(ids) != 1 || ids[0] != o.id {
				t.Errorf("submit %d (%s) answered id %s (duplicate %t), stored as %v", o.n, kind, o.id, o.dup, ids)
			}
		case errors.Is(o.err, client.ErrOutcomeUnknown):
			tally[kind+": outcome unknown"]++
			if !strings.Contains(o.err.Error(), "may have been done") && !strings.Contains(o.err.Error(), "unknown") {
				t.Errorf("submit %d (%s): %v; an unknown outcome must say the task may be stored", o.n, kind, o.err)
			}
		case errors.As(o.err, &ae):
			tally[fmt.Sprintf("%s: %d", kind, ae.Status)]++
			if len(ids) != 0 {
				t.Errorf("submit %d (%s) failed with %v and is stored as %v: an error that is not an unknown outcome must store nothing", o.n, kind, o.err, ids)
			}
			if ae.Message == "" {
				t.Errorf("submit %d (%s): %d without a message", o.n, kind, ae.Status)
			}
		default:
			t.Errorf("submit %d (%s): %v; want an id, an unknown outcome or an answer of the host's", o.n, kind, o.err)
		}
	}
	t.Logf("%d submits, %d connections cut after a dropped answer: %v", len(outcomes), proxy.dropped.Load(), tally)

	// The link is clean again: submits go through.
	if _, err := c.Submit(ctx, client.Task{Task: "demo.echo", Topic: "held", Payload: json.RawMessage(`{"n": -1}`)}); err != nil {
		t.Fatalf("a submit once the link is clean: %v", err)
	}
}
