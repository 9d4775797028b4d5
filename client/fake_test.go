package client_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/client"
)

// The tests in this file use an httptest server for answers a real host
// gives only when something breaks: a 503 with Retry-After, a 502 with an
// unknown outcome, a connection cut mid-answer.

// fast retries, so that the tests do not wait for the default backoff.
var fast = client.WithRetry(client.RetryPolicy{Attempts: 4, MinDelay: time.Millisecond, MaxDelay: 2 * time.Second})

// scripted answers each request with the next of its answers (the last
// repeats) and counts the requests.
type scripted struct {
	calls   atomic.Int32
	answers []func(w http.ResponseWriter)
	times   []time.Time
	mu      sync.Mutex
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := int(s.calls.Add(1))
	s.mu.Lock()
	s.times = append(s.times, time.Now())
	s.mu.Unlock()
	_, _ = io.Copy(io.Discard, r.Body)
	s.answers[min(n, len(s.answers))-1](w)
}

func answer(status int, header map[string]string, body string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

func serve(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestRetries(t *testing.T) {
	ctx := context.Background()
	unknown := answer(502, map[string]string{"X-Taskhost-Outcome": "unknown"}, `{"error":"plugin \"tasks_worker\" stopped before it answered; the outcome of this POST is unknown"}`)
	cases := []struct {
		name    string
		answers []func(w http.ResponseWriter)
		call    func(c *client.Client) error
		calls   int32
		check   func(t *testing.T, err error)
	}{
		{
			name:    "a submit answered 503 is sent again and succeeds",
			answers: []func(http.ResponseWriter){answer(503, nil, `{"error":"tasks_worker is not running"}`), answer(201, nil, `{"id":"7"}`)},
			call: func(c *client.Client) error {
				id, err := c.Submit(ctx, client.Task{Task: "demo.echo"})
				if err == nil && id != "7" {
					return fmt.Errorf("id %q, want 7", id)
				}
				return err
			},
			calls: 2,
		},
		{
			name:    "a submit with an unknown outcome is never sent again",
			answers: []func(http.ResponseWriter){unknown, answer(201, nil, `{"id":"8"}`)},
			call:    func(c *client.Client) error { _, err := c.Submit(ctx, client.Task{Task: "demo.echo"}); return err },
			calls:   1,
			check: func(t *testing.T, err error) {
				var ae *client.APIError
				if !errors.Is(err, client.ErrOutcomeUnknown) || !errors.As(err, &ae) || ae.Status != 502 || !ae.OutcomeUnknown || !strings.Contains(ae.Message, "outcome of this POST is unknown") {
					t.Fatalf("got %v; want ErrOutcomeUnknown as a 502 *APIError with the host's message", err)
				}
			},
		},
		{
			name:    "a GET answered 502 is read again",
			answers: []func(http.ResponseWriter){answer(502, nil, `{"error":"bad gateway"}`), answer(504, nil, `{"error":"timeout"}`), answer(200, nil, `{"id":"9","task":"demo.echo","state":"done"}`)},
			call: func(c *client.Client) error {
				tk, err := c.Get(ctx, "9")
				if err == nil && tk.State != "done" {
					return fmt.Errorf("state %q", tk.State)
				}
				return err
			},
			calls: 3,
		},
		{
			name:    "a 400 is not sent again and keeps the host's message",
			answers: []func(http.ResponseWriter){answer(400, nil, `{"error":"unknown task \"x\""}`)},
			call:    func(c *client.Client) error { _, err := c.Submit(ctx, client.Task{Task: "x"}); return err },
			calls:   1,
			check: func(t *testing.T, err error) {
				if !client.IsBadRequest(err) || err.Error() != `unknown task "x" (HTTP 400)` {
					t.Fatalf("got %v", err)
				}
			},
		},
		{
			name:    "503 until the attempts run out is an unavailable error",
			answers: []func(http.ResponseWriter){answer(503, nil, `{"error":"the broker is closed"}`)},
			call:    func(c *client.Client) error { _, err := c.Get(ctx, "1"); return err },
			calls:   4,
			check: func(t *testing.T, err error) {
				if !client.IsUnavailable(err) || !strings.Contains(err.Error(), "the broker is closed") {
					t.Fatalf("got %v", err)
				}
			},
		},
		{
			name:    "an answer that is not JSON still gives an error with its text",
			answers: []func(http.ResponseWriter){answer(500, nil, "something broke")},
			call:    func(c *client.Client) error { _, err := c.Schedules(ctx); return err },
			calls:   1,
			check: func(t *testing.T, err error) {
				if client.StatusOf(err) != 500 || !strings.Contains(err.Error(), "something broke") {
					t.Fatalf("got %v", err)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &scripted{answers: tc.answers}
			err := tc.call(client.New(serve(t, s), fast))
			if tc.check != nil {
				tc.check(t, err)
			} else if err != nil {
				t.Fatal(err)
			}
			if got := s.calls.Load(); got != tc.calls {
				t.Fatalf("the server got %d requests; want %d", got, tc.calls)
			}
		})
	}
}

// TestRetryAfterIsHonoured: the wait after a 503 is the Retry-After the
// host asked for, not the (here much shorter) backoff.
func TestRetryAfterIsHonoured(t *testing.T) {
	s := &scripted{answers: []func(http.ResponseWriter){
		answer(503, map[string]string{"Retry-After": "1"}, `{"error":"plugin \"tasks_worker\" is restarting"}`),
		answer(201, nil, `{"id":"1"}`),
	}}
	c := client.New(serve(t, s), fast)
	if _, err := c.Submit(context.Background(), client.Task{Task: "demo.echo"}); err != nil {
		t.Fatal(err)
	}
	if gap := s.times[1].Sub(s.times[0]); gap < time.Second {
		t.Fatalf("the retry came %s after the 503; Retry-After asked for 1s", gap)
	}
}

// TestConnectionCutAfterTheRequest: a submit whose connection breaks
// before the answer may have been stored: ErrOutcomeUnknown, not retried.
// A GET in the same case is read again.
func TestConnectionCutAfterTheRequest(t *testing.T) {
	var calls atomic.Int32
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 || r.Method == http.MethodPost {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		_, _ = io.WriteString(w, `{"id":"3","state":"queued"}`)
	}))
	c := client.New(url, fast)
	if tk, err := c.Get(context.Background(), "3"); err != nil || tk.ID != "3" {
		t.Fatalf("GET after a cut connection: %+v, %v; want it read again", tk, err)
	}
	calls.Store(0)
	_, err := c.Submit(context.Background(), client.Task{Task: "demo.echo"})
	if !errors.Is(err, client.ErrOutcomeUnknown) || calls.Load() != 1 {
		t.Fatalf("POST after a cut connection: %v after %d requests; want ErrOutcomeUnknown after 1", err, calls.Load())
	}
}

// TestNoHost: a host that is not there says so, and how to fix it.
func TestNoHost(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	_, err := client.New(url, fast).Submit(context.Background(), client.Task{Task: "demo.echo"})
	if err == nil || !strings.Contains(err.Error(), "cannot reach the host") || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("got %v; want 'cannot reach the host', not an unknown outcome (nothing was sent)", err)
	}
}

// batchServer speaks the batch contract: NDJSON in, committed chunks out
// as they are stored. A chunk is stored at 1,000 lines or when no more of
// the body has arrived yet. A task named "bad" stops the upload; before
// any chunk is stored, that is a plain 400 when plain400 is set.
type batchServer struct {
	plain400 bool
	cut      bool // read the body, answer two chunks, drop the connection
	nextID   atomic.Int64
}

func (b *batchServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/plugin-pkg/tasks_worker/api/tasks/batch" || r.Header.Get("Content-Type") != "application/x-ndjson" {
		http.Error(w, "wrong path or type", 400)
		return
	}
	rc := http.NewResponseController(w)
	if b.cut {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, `{"first_line":1,"last_line":2,"ids":["1","2"]}`+"\n"+`{"first_line":3,"last_line":3,"ids":["3"]}`+"\n")
		_ = rc.Flush()
		if conn, _, err := rc.Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	_ = rc.EnableFullDuplex()
	in := bufio.NewReader(r.Body)
	stored, line := 0, 0
	var pending []string
	first := 1
	started := false
	enc := json.NewEncoder(w)
	commit := func() {
		if len(pending) == 0 && first > line {
			return
		}
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			started = true
		}
		_ = enc.Encode(map[string]any{"first_line": first, "last_line": line, "ids": pending})
		_ = rc.Flush()
		stored += len(pending)
		pending, first = nil, line+1
	}
	for {
		text, err := in.ReadString('\n')
		if text == "" && err != nil {
			break
		}
		line++
		if strings.TrimSpace(text) != "" {
			var item struct {
				Task string `json:"task"`
			}
			if json.Unmarshal([]byte(text), &item) != nil || item.Task == "" || item.Task == "bad" {
				msg := fmt.Sprintf("line %d: unknown task %q", line, item.Task)
				if !started && b.plain400 {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(400)
					_ = enc.Encode(map[string]any{"error": msg, "line": line})
					return
				}
				line--
				commit()
				_ = enc.Encode(map[string]any{"done": false, "stored": stored, "line": line + 1, "error": msg})
				return
			}
			pending = append(pending, strconv.FormatInt(b.nextID.Add(1), 10))
		}
		if len(pending) == 1000 || in.Buffered() == 0 {
			commit()
		}
	}
	commit()
	_ = enc.Encode(map[string]any{"done": true, "stored": stored, "lines": line})
}

func tasksOf(n int, bad int) []client.Task {
	out := make([]client.Task, n)
	for i := range out {
		out[i] = client.Task{Task: "demo.echo", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
		if i+1 == bad {
			out[i].Task = "bad"
		}
	}
	return out
}

func TestSubmitBatchAgainstTheContract(t *testing.T) {
	ctx := context.Background()
	t.Run("all stored, with every chunk reported in order", func(t *testing.T) {
		c := client.New(serve(t, &batchServer{}))
		var last int
		res, err := c.SubmitTasks(ctx, tasksOf(5000, 0), client.WithProgress(func(ch client.Chunk) {
			if ch.FirstLine != last+1 || len(ch.IDs) != ch.LastLine-ch.FirstLine+1 {
				t.Errorf("chunk %+v after line %d", ch, last)
			}
			last = ch.LastLine
		}))
		if err != nil || res.Stored != 5000 || res.Lines != 5000 || len(res.IDs) != 5000 || res.IDs[4999] != "5000" || last != 5000 {
			t.Fatalf("got %d stored, %d lines, %d ids, last chunk line %d, %v", res.Stored, res.Lines, len(res.IDs), last, err)
		}
	})
	t.Run("a bad line after stored chunks stops there", func(t *testing.T) {
		c := client.New(serve(t, &batchServer{plain400: true}))
		res, err := c.SubmitTasks(ctx, tasksOf(3000, 2500))
		var be *client.BatchError
		if !errors.As(err, &be) || be.Line != 2500 || be.Stored != 2499 || res.Stored != 2499 || !strings.Contains(be.Error(), `line 2500: unknown task "bad"`) {
			t.Fatalf("got %+v, %v; want a *BatchError at line 2500 with 2499 stored", res, err)
		}
	})
	t.Run("a bad first line answered with a plain 400", func(t *testing.T) {
		c := client.New(serve(t, &batchServer{plain400: true}))
		res, err := c.SubmitNDJSON(ctx, strings.NewReader("\n{\"task\":\"bad\"}\n{\"task\":\"demo.echo\"}\n"))
		var be *client.BatchError
		if !errors.As(err, &be) || be.Line != 2 || be.Stored != 0 || res.Stored != 0 {
			t.Fatalf("got %+v, %v; want a *BatchError at line 2 (blank lines count), nothing stored", res, err)
		}
	})
	t.Run("an answer cut mid-stream is an unknown outcome with what was stored", func(t *testing.T) {
		c := client.New(serve(t, &batchServer{cut: true}))
		res, err := c.SubmitTasks(ctx, tasksOf(5000, 0))
		if !errors.Is(err, client.ErrOutcomeUnknown) || res.Stored != 3 || !strings.Contains(err.Error(), "after 3 stored tasks") {
			t.Fatalf("got %+v, %v; want ErrOutcomeUnknown with the 3 tasks of 2 chunks stored", res.Stored, err)
		}
	})
}

// TestSubmitBatchStreams: tasks are sent and stored while the producer
// still makes them: the producer waits for the first chunk's report
// before it yields the rest, which would never come if the client held
// the batch back.
func TestSubmitBatchStreams(t *testing.T) {
	c := client.New(serve(t, &batchServer{}))
	firstChunk := make(chan struct{})
	var once sync.Once
	seq := func(yield func(client.Task) bool) {
		for i := range 10 {
			if !yield(client.Task{Task: "demo.echo", Payload: json.RawMessage(strconv.Itoa(i))}) {
				return
			}
		}
		select {
		case <-firstChunk:
		case <-time.After(60 * time.Second):
			t.Error("no chunk was reported within 60s of the first 10 tasks")
			return
		}
		for i := range 10 {
			if !yield(client.Task{Task: "demo.echo", Payload: json.RawMessage(strconv.Itoa(10 + i))}) {
				return
			}
		}
	}
	res, err := c.SubmitBatch(context.Background(), seq, client.WithProgress(func(client.Chunk) { once.Do(func() { close(firstChunk) }) }))
	if err != nil || res.Stored != 20 || res.IDs != nil {
		t.Fatalf("got %+v, %v; want 20 stored and no ids kept", res, err)
	}
}
