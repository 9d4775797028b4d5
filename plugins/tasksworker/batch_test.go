package tasksworker

// POST /api/tasks/batch on the local store and on PostgreSQL: the JSON
// array (all or nothing) and NDJSON (chunks as the body arrives).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/capability/capabilitytest"
	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/internal/testhost"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

// batchStores are the stores the batch tests run on.
var batchStores = map[string]func(tb testing.TB) map[string]any{
	"local": func(tb testing.TB) map[string]any {
		return map[string]any{"broker": "local", "data_dir": filepath.Join(tb.TempDir(), "data")}
	},
	"postgres": func(tb testing.TB) map[string]any {
		return map[string]any{"broker": "postgres", "dsn": testdb.DSN(), "schema": testdb.FreshSchema(tb, "tw_test_")}
	},
}

// startPaused starts the plugin with logger on config and pauses the
// topic default, so the tasks stored stay queued and nothing else uses
// the CPU.
func startPaused(tb testing.TB, logger hclog.Logger, config map[string]any) *Plugin {
	tb.Helper()
	p := New(logger)
	config["drain_timeout_seconds"] = 0
	capabilitytest.Start(tb, p, config, nil)
	rec := serve(p, "PUT", "/api/topics/default", "application/json", strings.NewReader(`{"paused": true}`))
	if rec.Code != http.StatusOK {
		tb.Fatalf("pause the topic default: %d %s", rec.Code, rec.Body)
	}
	return p
}

// serve calls the plugin's HTTP handler in process.
func serve(p *Plugin, method, target, contentType string, body io.Reader) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, body)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, req)
	return rec
}

// storedLines returns the line numbers (payload n) of all stored tasks,
// in the order of their ids.
func storedLines(t *testing.T, p *Plugin) []int {
	t.Helper()
	var out []int
	f := broker.MessageFilter{Limit: broker.MaxListLimit}
	for {
		msgs, err := p.current().broker.ListMessages(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			var pl struct{ N int }
			if err := json.Unmarshal(m.Payload, &pl); err != nil {
				t.Fatalf("task %d payload %s: %v", m.ID, m.Payload, err)
			}
			out = append(out, pl.N)
		}
		if len(msgs) < f.Limit {
			break
		}
		f.Before = msgs[len(msgs)-1].ID
	}
	slices.Reverse(out) // newest first
	return out
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// ndjson is lines from to to: a task each, whose payload n is its line.
func ndjson(from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintf(&b, `{"task": "demo.echo", "payload": {"n": %d}}`+"\n", i)
	}
	return b.String()
}

func jsonArray(from, to int) string {
	return "[" + strings.Join(strings.Split(strings.TrimSuffix(ndjson(from, to), "\n"), "\n"), ",") + "]"
}

// ndAnswer is an NDJSON answer: its chunk lines and its final line.
type ndAnswer struct {
	chunks []ndChunkLine
	final  map[string]any
}

type ndChunkLine struct {
	FirstLine int      `json:"first_line"`
	LastLine  int      `json:"last_line"`
	IDs       []string `json:"ids"`
	// Duplicates: indexes into IDs of the lines that were duplicates.
	Duplicates []int `json:"duplicates"`
}

func parseNDAnswer(t *testing.T, body []byte) ndAnswer {
	t.Helper()
	var a ndAnswer
	for line := range strings.Lines(string(body)) {
		if a.final != nil {
			t.Fatalf("a line after the final line: %q", line)
		}
		if strings.Contains(line, `"done":`) {
			if err := json.Unmarshal([]byte(line), &a.final); err != nil {
				t.Fatalf("final line %q: %v", line, err)
			}
			continue
		}
		var c ndChunkLine
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("chunk line %q: %v", line, err)
		}
		a.chunks = append(a.chunks, c)
	}
	return a
}

func (a ndAnswer) ids() []string {
	var out []string
	for _, c := range a.chunks {
		out = append(out, c.IDs...)
	}
	return out
}

func TestBatchJSON(t *testing.T) {
	for store, cfg := range batchStores {
		t.Run(store, func(t *testing.T) {
			p := startPaused(t, testLogger(t), cfg(t))
			post := func(body string) *httptest.ResponseRecorder {
				return serve(p, "POST", "/api/tasks/batch", "application/json", strings.NewReader(body))
			}

			rec := post(`[{"task": "demo.echo", "payload": {"n": 1}}, {"task": "demo.echo", "topic": "default", "payload": {"n": 2}, "max_attempts": 4}, {"task": "demo.sleep", "payload": {"n": 3}, "delay_seconds": 60}]`)
			var ok struct{ IDs []string }
			if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &ok) != nil || len(ok.IDs) != 3 {
				t.Fatalf("a good batch: %d %s", rec.Code, rec.Body)
			}
			for i, id := range ok.IDs {
				n, _ := strconv.ParseInt(id, 10, 64)
				m, err := p.current().svc.Message(context.Background(), n)
				if err != nil {
					t.Fatalf("id %q: %v", id, err)
				}
				if want := map[string]int{"n": i + 1}; !jsonEqual(t, m.Payload, want) || m.Topic != "default" {
					t.Errorf("task %s = %s on %s, want %v on default", id, m.Payload, m.Topic, want)
				}
				if i == 1 && m.MaxAttempts != 4 {
					t.Errorf("max_attempts of item 1 = %d, want 4", m.MaxAttempts)
				}
				if i == 2 && (m.Task != "demo.sleep" || !m.AvailableAt.After(m.CreatedAt.Add(59*time.Second))) {
					t.Errorf("item 2 = %s available at %v (created %v), want demo.sleep delayed 60s", m.Task, m.AvailableAt, m.CreatedAt)
				}
			}
			if got := storedLines(t, p); !slices.Equal(got, []int{1, 2, 3}) {
				t.Fatalf("stored %v", got)
			}

			if rec := post(`[]`); rec.Code != http.StatusCreated || strings.TrimSpace(rec.Body.String()) != `{"ids":[]}` {
				t.Errorf("an empty array: %d %s, want 201 with no ids", rec.Code, rec.Body)
			}

			refused := []struct {
				name, body, want string
				index            int
			}{
				{"unknown task", `[{"task": "demo.echo"}, {"task": "demo.echo"}, {"task": "no.such"}, {"task": "demo.echo"}]`, `item 2: unknown task "no.such"`, 2},
				{"bad payload", `[{"task": "demo.echo", "payload": {"s": "a\u0000"}}]`, `item 0: payload: it holds \u0000`, 0},
				{"duplicate key", `[{"task": "demo.echo"}, {"task": "demo.echo", "task": "demo.fail"}]`, `item 1: key "task" appears twice in the item`, 1},
				{"unknown field", `[{"task": "demo.echo", "colour": 1}]`, `item 0: unknown field "colour" in the item`, 0},
				{"not an object", `[{"task": "demo.echo"}, 7]`, `item 1: the item must be a JSON object`, 1},
				{"bad JSON in an item", `[{"task": "demo.echo"}, {"task": nope}]`, `item 1: the item is not valid JSON`, 1},
				{"too deep", `[{"task": "demo.echo", "payload": ` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}]`, `item 0: field "payload" nests arrays`, 0},
			}
			for _, tc := range refused {
				t.Run(tc.name, func(t *testing.T) {
					before := len(storedLines(t, p))
					rec := post(tc.body)
					var e struct {
						Error string
						Index *int
					}
					if rec.Code != http.StatusBadRequest || json.Unmarshal(rec.Body.Bytes(), &e) != nil || !strings.HasPrefix(e.Error, tc.want) || e.Index == nil || *e.Index != tc.index {
						t.Errorf("%s: %d %s, want 400 with index %d and %q", tc.body, rec.Code, rec.Body, tc.index, tc.want)
					}
					if after := len(storedLines(t, p)); after != before {
						t.Errorf("a refused batch stored %d tasks", after-before)
					}
				})
			}

			before := len(storedLines(t, p))
			for _, tc := range []struct{ name, body, want string }{
				{"over the limit", jsonArray(1, broker.MaxSubmitBatch+1), "more than 10000 tasks"},
				{"not an array", `{"task": "demo.echo"}`, "must be a JSON array of tasks"},
				{"empty body", ``, "must be a JSON array of tasks"},
				{"unclosed array", `[{"task": "demo.echo"}`, "not valid JSON"},
				{"two arrays", `[] []`, "more than one JSON value"},
			} {
				rec := post(tc.body)
				if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), tc.want) {
					t.Errorf("%s: %d %.300s, want 400 saying %q", tc.name, rec.Code, rec.Body, tc.want)
				}
			}
			if rec := post(jsonArray(1, broker.MaxSubmitBatch)); rec.Code != http.StatusCreated {
				t.Errorf("%d tasks (the limit): %d %.300s", broker.MaxSubmitBatch, rec.Code, rec.Body)
			}
			if after := len(storedLines(t, p)); after != before+broker.MaxSubmitBatch {
				t.Errorf("stored %d tasks, want the %d of the one good batch", after-before, broker.MaxSubmitBatch)
			}
		})
	}
}

// TestBatchThroughTheHost sends a batch of each form through the plugin
// protocol, as the host does.
func TestBatchThroughTheHost(t *testing.T) {
	f := start(t, nil)
	res := f.do("POST", "/api/tasks/batch", `[{"task": "demo.echo", "payload": {"n": 1}}]`)
	if res.status != http.StatusCreated || len(res.json(t)["ids"].([]any)) != 1 {
		t.Fatalf("JSON batch: %d %s", res.status, res.body)
	}
	id := res.json(t)["ids"].([]any)[0].(string)
	if got := f.waitState(id, "done"); !jsonEqual(t, got["result"], map[string]any{"n": 1.0}) {
		t.Errorf("result = %v", got["result"])
	}
}

func TestBatchNDJSON(t *testing.T) {
	for store, cfg := range batchStores {
		t.Run(store, func(t *testing.T) {
			p := startPaused(t, testLogger(t), cfg(t))
			post := func(body string) *httptest.ResponseRecorder {
				return serve(p, "POST", "/api/tasks/batch", "application/x-ndjson", strings.NewReader(body))
			}
			check := func(rec *httptest.ResponseRecorder) ndAnswer {
				t.Helper()
				if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/x-ndjson" {
					t.Fatalf("%d %s %.300s, want 200 application/x-ndjson", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
				}
				return parseNDAnswer(t, rec.Body.Bytes())
			}

			// 2,500 lines: three chunks, then done.
			a := check(post(ndjson(1, 2500)))
			spans := [][2]int{{1, 1000}, {1001, 2000}, {2001, 2500}}
			if len(a.chunks) != 3 {
				t.Fatalf("%d chunk lines, want 3", len(a.chunks))
			}
			for i, c := range a.chunks {
				if c.FirstLine != spans[i][0] || c.LastLine != spans[i][1] || len(c.IDs) != spans[i][1]-spans[i][0]+1 {
					t.Errorf("chunk %d: lines %d-%d with %d ids, want %v", i, c.FirstLine, c.LastLine, len(c.IDs), spans[i])
				}
			}
			if !jsonEqual(t, a.final, map[string]any{"done": true, "stored": 2500, "lines": 2500}) {
				t.Errorf("final line %v", a.final)
			}
			for i, id := range a.ids() {
				n, _ := strconv.ParseInt(id, 10, 64)
				m, err := p.current().svc.Message(context.Background(), n)
				if err != nil || !jsonEqual(t, m.Payload, map[string]int{"n": i + 1}) {
					t.Fatalf("id %s of line %d: %s, %v", id, i+1, m.Payload, err)
				}
			}
			if got := storedLines(t, p); !slices.Equal(got, seq(1, 2500)) {
				t.Fatalf("stored %d tasks, want lines 1 to 2500 in order", len(got))
			}
		})
	}
}

// TestBatchNDJSONStops checks the first-bad-line rule: every line before
// it is stored, nothing from it on.
func TestBatchNDJSONStops(t *testing.T) {
	for store, cfg := range batchStores {
		t.Run(store, func(t *testing.T) {
			c := cfg(t)
			c["max_payload_bytes"] = 100
			p := startPaused(t, testLogger(t), c)
			post := func(body string) *httptest.ResponseRecorder {
				return serve(p, "POST", "/api/tasks/batch", "application/x-ndjson", strings.NewReader(body))
			}
			long := `{"task": "demo.echo", "payload": "` + strings.Repeat("a", 70<<10) + `"}` + "\n"
			cases := []struct {
				name, body string
				chunks     [][2]int // the spans of the chunk lines
				stop       int
				want       string
				stored     []int
			}{
				{"not JSON at line 1,500", ndjson(1, 1499) + "{nope\n" + ndjson(1501, 1600), [][2]int{{1, 1000}, {1001, 1499}}, 1500, "line 1500: the line is not valid JSON", seq(1, 1499)},
				{"unknown task at line 1,200", ndjson(1, 1199) + `{"task": "no.such"}` + "\n" + ndjson(1201, 2600), [][2]int{{1, 1000}, {1001, 1199}}, 1200, `line 1200: unknown task "no.such"`, seq(1, 1199)},
				{"unknown field at line 3", ndjson(1, 2) + `{"task": "demo.echo", "Payload": {}}` + "\n", [][2]int{{1, 2}}, 3, `line 3: unknown field "Payload" in the line`, seq(1, 2)},
				{"over-long line", ndjson(1, 2) + long + ndjson(4, 5), [][2]int{{1, 2}}, 3, "line 3: the line is over 65636 bytes", seq(1, 2)},
				{"payload over max_payload_bytes", ndjson(1, 1) + `{"task": "demo.echo", "payload": "` + strings.Repeat("a", 200) + `"}` + "\n", [][2]int{{1, 1}}, 2, "line 2: payload is 202 bytes, the limit is 100", seq(1, 1)},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					before := storedLines(t, p)
					rec := post(tc.body)
					if rec.Code != http.StatusOK {
						t.Fatalf("%d %.300s", rec.Code, rec.Body)
					}
					a := parseNDAnswer(t, rec.Body.Bytes())
					var spans [][2]int
					for _, c := range a.chunks {
						spans = append(spans, [2]int{c.FirstLine, c.LastLine})
					}
					if !slices.Equal(spans, tc.chunks) {
						t.Errorf("chunks %v, want %v", spans, tc.chunks)
					}
					if msg, _ := a.final["error"].(string); a.final["done"] != false || a.final["line"] != float64(tc.stop) ||
						a.final["stored"] != float64(len(tc.stored)) || !strings.HasPrefix(msg, tc.want) {
						t.Errorf("final line %v, want line %d stopped with %q", a.final, tc.stop, tc.want)
					}
					if got := storedLines(t, p)[len(before):]; !slices.Equal(got, tc.stored) {
						t.Errorf("stored lines %v, want %v", got, tc.stored)
					}
				})
			}

			// Blank lines are counted, not stored.
			rec := post("\n" + strings.TrimSuffix(ndjson(1, 1), "\n") + "\r\n  \n" + strings.TrimSuffix(ndjson(4, 4), "\n"))
			a := parseNDAnswer(t, rec.Body.Bytes())
			if len(a.chunks) != 1 || a.chunks[0].FirstLine != 1 || a.chunks[0].LastLine != 4 || len(a.chunks[0].IDs) != 2 ||
				!jsonEqual(t, a.final, map[string]any{"done": true, "stored": 2, "lines": 4}) {
				t.Errorf("with blank lines: %s", rec.Body)
			}

			// Nothing at all: done, none stored.
			if rec := post(""); rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != `{"done":true,"stored":0,"lines":0}` {
				t.Errorf("an empty body: %d %s", rec.Code, rec.Body)
			}

			// A bad first line stores nothing: a plain 400.
			before := len(storedLines(t, p))
			for _, body := range []string{"{nope\n" + ndjson(2, 3), long} {
				rec := post(body)
				var e struct {
					Error string
					Line  int
				}
				if rec.Code != http.StatusBadRequest || rec.Header().Get("Content-Type") != "application/json" ||
					json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Line != 1 || !strings.HasPrefix(e.Error, "line 1: ") {
					t.Errorf("a bad first line: %d %s", rec.Code, rec.Body)
				}
			}
			if after := len(storedLines(t, p)); after != before {
				t.Errorf("a bad first line stored %d tasks", after-before)
			}
		})
	}
}

// flushWriter is a ResponseWriter that a test reads while the handler
// writes, and that signals each Flush.
type flushWriter struct {
	mu      sync.Mutex
	header  http.Header
	status  int
	body    bytes.Buffer
	flushed chan struct{}
}

func newFlushWriter() *flushWriter {
	return &flushWriter{header: http.Header{}, flushed: make(chan struct{}, 1000)}
}

func (w *flushWriter) Header() http.Header { return w.header }
func (w *flushWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == 0 {
		w.status = code
	}
}
func (w *flushWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(p)
}
func (w *flushWriter) Flush() {
	select {
	case w.flushed <- struct{}{}:
	default:
	}
}
func (w *flushWriter) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.body.Bytes())
}

// servePiped starts an NDJSON upload to p whose body the test writes
// through send; served is closed when the handler returns.
func servePiped(p http.Handler) (send *io.PipeWriter, w *flushWriter, served chan struct{}) {
	body, send := io.Pipe()
	w = newFlushWriter()
	req := httptest.NewRequest("POST", "/api/tasks/batch", body)
	req.Header.Set("Content-Type", "application/x-ndjson")
	served = make(chan struct{})
	go func() {
		defer close(served)
		p.ServeHTTP(w, req)
	}()
	return send, w, served
}

// TestBatchNDJSONClientCutOff: a client that goes away mid-stream keeps
// the chunks that were committed, whole, and nothing else; the plugin logs
// what was stored at WARN.
func TestBatchNDJSONClientCutOff(t *testing.T) {
	for store, cfg := range batchStores {
		t.Run(store, func(t *testing.T) {
			var logs testhost.SyncBuffer
			logger := hclog.New(&hclog.LoggerOptions{Name: "tasks_worker", Level: hclog.Info, JSONFormat: true, Output: &logs})
			p := startPaused(t, logger, cfg(t))

			send, w, served := servePiped(p)
			if _, err := io.WriteString(send, ndjson(1, 1000)); err != nil {
				t.Fatal(err)
			}
			// The first chunk is stored and its line flushed, and then
			// 200 more lines arrive before the client is cut off.
			select {
			case <-w.flushed:
			case <-time.After(60 * time.Second):
				t.Fatal("the first chunk's line was never flushed")
			}
			if _, err := io.WriteString(send, ndjson(1001, 1200)); err != nil {
				t.Fatal(err)
			}
			send.CloseWithError(errors.New("connection reset by peer"))
			select {
			case <-served:
			case <-time.After(60 * time.Second):
				t.Fatal("the handler did not end after the body failed")
			}

			a := parseNDAnswer(t, w.bytes())
			ids := a.ids()
			// Typically the first chunk's 1,000. More when lines idled
			// out (200 ms with no line) before the body failed, and on a
			// loaded machine a pause between two lines can split a chunk,
			// so fewer too: whatever the count, it must be a whole prefix
			// of committed chunks, as checked below.
			if n := len(ids); n < 1 || n > 1200 {
				t.Fatalf("the answer names %d ids, want from 1 (a stored chunk) to the 1200 lines sent", n)
			}
			stored := storedLines(t, p)
			if !slices.Equal(stored, seq(1, len(ids))) {
				t.Fatalf("stored %d tasks (lines %v...), want exactly lines 1 to %d, those of the committed chunks", len(stored), stored[:min(5, len(stored))], len(ids))
			}
			if a.final["done"] != false || a.final["stored"] != float64(len(ids)) {
				t.Errorf("final line %v", a.final)
			}

			var warn map[string]any
			sc := bufio.NewScanner(strings.NewReader(logs.String()))
			for sc.Scan() {
				var e map[string]any
				if json.Unmarshal(sc.Bytes(), &e) == nil && e["@level"] == "warn" && strings.Contains(e["@message"].(string), "cut off") {
					warn = e
				}
			}
			if warn == nil {
				t.Fatalf("no WARN line about the cut-off upload in the log:\n%s", logs.String())
			}
			if warn["lines_stored"] != float64(len(ids)) || warn["last_stored_line"] != float64(len(ids)) ||
				fmt.Sprint(warn["first_id"]) != ids[0] || fmt.Sprint(warn["last_id"]) != ids[len(ids)-1] {
				t.Errorf("WARN line %v, want %d lines stored, the last %d, ids %s to %s", warn, len(ids), len(ids), ids[0], ids[len(ids)-1])
			}
		})
	}
}

// TestBatchNDJSONIdleStore: a producer that pauses sees what it sent
// stored without sending more.
func TestBatchNDJSONIdleStore(t *testing.T) {
	p := startPaused(t, testLogger(t), batchStores["local"](t))
	send, w, served := servePiped(p)
	if _, err := io.WriteString(send, ndjson(1, 3)); err != nil {
		t.Fatal(err)
	}
	// A loaded machine may store them in more than one chunk (a pause
	// between two of the lines idles out too): wait until all 3 are.
	deadline := time.After(60 * time.Second)
	for len(parseNDAnswer(t, w.bytes()).ids()) < 3 {
		select {
		case <-w.flushed:
		case <-deadline:
			t.Fatalf("3 lines, then nothing: never all stored; answer so far %s", w.bytes())
		}
	}
	if _, err := io.WriteString(send, ndjson(4, 4)); err != nil {
		t.Fatal(err)
	}
	send.Close()
	<-served
	a := parseNDAnswer(t, w.bytes())
	last := a.chunks[len(a.chunks)-1]
	if len(a.chunks) < 2 || last.FirstLine != 4 || len(last.IDs) != 1 || !jsonEqual(t, a.final, map[string]any{"done": true, "stored": 4, "lines": 4}) {
		t.Errorf("answer %s, want line 4 in a chunk of its own after the first 3 lines", w.bytes())
	}
}

func TestBatchContentType(t *testing.T) {
	p := startPaused(t, testLogger(t), batchStores["local"](t))
	for _, ct := range []string{"", "text/plain", "application/xml"} {
		rec := serve(p, "POST", "/api/tasks/batch", ct, strings.NewReader(ndjson(1, 1)))
		if rec.Code != http.StatusUnsupportedMediaType || !strings.Contains(rec.Body.String(), "application/json") || !strings.Contains(rec.Body.String(), "application/x-ndjson") {
			t.Errorf("Content-Type %q: %d %s, want 415 naming the two accepted", ct, rec.Code, rec.Body)
		}
	}
	if rec := serve(p, "POST", "/api/tasks/batch", "application/json; charset=utf-8", strings.NewReader(jsonArray(1, 1))); rec.Code != http.StatusCreated {
		t.Errorf("application/json with a charset: %d %s", rec.Code, rec.Body)
	}
	if got := len(storedLines(t, p)); got != 1 {
		t.Errorf("stored %d tasks, want the 1 of the accepted request", got)
	}
}

// BenchmarkBatchNDJSON: NDJSON uploads of 20,000 tasks through the
// handler, in process; tasks/s is the rate. The <store>-SubmitMany cases
// are the ceiling with one chunk in flight: the same tasks, checked
// before the clock starts, stored by SubmitMany in chunks of 1,000, one
// after the other.
func BenchmarkBatchNDJSON(b *testing.B) {
	const lines = 20000
	body := []byte(ndjson(1, lines))
	for _, store := range []string{"local", "postgres"} {
		b.Run(store, func(b *testing.B) {
			p := startPaused(b, hclog.NewNullLogger(), batchStores[store](b))
			n := 0
			for b.Loop() {
				n++
				rec := serve(p, "POST", "/api/tasks/batch", "application/x-ndjson", bytes.NewReader(body))
				if rec.Code != http.StatusOK || !strings.HasSuffix(rec.Body.String(), fmt.Sprintf(`{"done":true,"stored":%d,"lines":%d}`+"\n", lines, lines)) {
					b.Fatalf("%d %.300s", rec.Code, rec.Body)
				}
			}
			b.ReportMetric(float64(lines*n)/b.Elapsed().Seconds(), "tasks/s")
		})
		b.Run(store+"-SubmitMany", func(b *testing.B) {
			p := startPaused(b, hclog.NewNullLogger(), batchStores[store](b))
			rt := p.current()
			var chunks []service.Batch
			for from := 1; from <= lines; from += ndjsonChunk {
				var reqs []service.SubmitRequest
				for l := range strings.Lines(ndjson(from, from+ndjsonChunk-1)) {
					req, err := decodeItem([]byte(l), lineLimit(rt), "the line")
					if err != nil {
						b.Fatal(err)
					}
					reqs = append(reqs, req)
				}
				c, err := rt.svc.Check(context.Background(), reqs)
				if err != nil {
					b.Fatal(err)
				}
				chunks = append(chunks, c)
			}
			n := 0
			for b.Loop() {
				n++
				for _, c := range chunks {
					if _, err := rt.svc.Store(context.Background(), c); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(lines*n)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}
