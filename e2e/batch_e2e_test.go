package e2e

// Batches of tasks through the real host to tasks_worker on PostgreSQL,
// each verdict read from the database: NDJSON uploads whose lines are
// strange, cut or stalled, or a million; JSON batches while the plugin is
// SIGKILLed; one unique key raced from two hosts.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// batchTopics: bulk is paused, so what a batch stores stays queued and is
// read back as it was stored.
const batchTopics = "{default: {}, bulk: {paused: true}}"

// ndLine is one line of a task for topic bulk, tagged with its case and
// its line number.
func ndLine(tag string, n int) string {
	return fmt.Sprintf(`{"task":"demo.echo","topic":"bulk","payload":{"c":%q,"n":%d}}`+"\n", tag, n)
}

func ndLines(tag string, from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		b.WriteString(ndLine(tag, i))
	}
	return b.String()
}

// storedNs returns the line numbers stored under tag, in the order of the
// tasks' ids.
func storedNs(t *testing.T, db *pgx.Conn, tag string) []int {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT (payload->>'n')::int FROM tw_messages_all WHERE payload->>'c' = $1 ORDER BY id`, tag)
	if err != nil {
		t.Fatalf("read the tasks of %s: %v", tag, err)
	}
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatalf("read the tasks of %s: %v", tag, err)
	}
	return ns
}

func oneTo(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// ndResult is an NDJSON batch's answer: the ids of its chunk lines, and
// its final line (nil when it has none) or its plain JSON error.
type ndResult struct {
	status int
	ids    []string
	final  map[string]any
	body   string
}

func readNDAnswer(t *testing.T, resp *http.Response) ndResult {
	t.Helper()
	defer resp.Body.Close()
	r := ndResult{status: resp.StatusCode}
	if resp.Header.Get("Content-Type") != "application/x-ndjson" {
		b, _ := io.ReadAll(resp.Body)
		r.body = string(b)
		return r
	}
	br := bufio.NewReaderSize(resp.Body, 1<<20)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			var m map[string]any
			if jerr := json.Unmarshal(line, &m); jerr != nil {
				t.Fatalf("an answer line that is not JSON: %q", line)
			}
			if _, ok := m["done"]; ok {
				r.final = m
			} else {
				for _, id := range m["ids"].([]any) {
					r.ids = append(r.ids, id.(string))
				}
			}
		}
		if err != nil {
			return r
		}
	}
}

func postNDJSON(t *testing.T, h *hostProc, body io.Reader) ndResult {
	t.Helper()
	req, err := http.NewRequest("POST", h.api("/tasks/batch"), body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+reaperToken)
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := (&http.Client{Timeout: 10 * time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("NDJSON upload: %v", err)
	}
	return readNDAnswer(t, resp)
}

// TestNDJSONBatchLinesAtTheEdgesThroughTheHost: a last line without its
// newline is a line; a line with bytes that are not UTF-8, a duplicate key
// or nesting past the limit stops the upload there, every line before it
// stored and nothing from it on; such a first line is a plain 400 and
// stores nothing. The plugin serves on in the same process.
func TestNDJSONBatchLinesAtTheEdgesThroughTheHost(t *testing.T) {
	schema := pgSchema(t)
	h := startHost(t, twConfig(schema, twOpts{topics: batchTopics}))
	st, _ := h.waitWorker(t, 0)
	db := pgConn(t, schema)

	deep := func(tag string, n int) string {
		return fmt.Sprintf(`{"task":"demo.echo","topic":"bulk","payload":{"c":%q,"n":%d,"x":%s1%s}}`+"\n",
			tag, n, strings.Repeat("[", 5000), strings.Repeat("]", 5000))
	}
	cases := []struct {
		name, tag, body string
		stored          int    // lines 1 to stored are stored
		stop            int    // the line that stopped the upload; 0: none
		want            string // in the refusal
	}{
		{"no newline after the last line", "eol", strings.TrimSuffix(ndLines("eol", 1, 3), "\n"), 3, 0, ""},
		{"no newline after a long last line", "eol-chunk", strings.TrimSuffix(ndLines("eol-chunk", 1, 2345), "\n"), 2345, 0, ""},
		{"a payload string that is not UTF-8", "utf8", ndLines("utf8", 1, 1200) +
			`{"task":"demo.echo","topic":"bulk","payload":{"c":"utf8","n":1201,"s":"caf` + "\xe9" + `"}}` + "\n" + ndLines("utf8", 1202, 1300), 1200, 1201, "UTF-8"},
		{"a key that is not UTF-8", "utf8key", ndLines("utf8key", 1, 2) +
			`{"task":"demo.echo","topic":"bulk","payload":{"c":"utf8key","n":3,"` + "\xff\xfe" + `":1}}` + "\n" + ndLines("utf8key", 4, 5), 2, 3, "UTF-8"},
		{"a duplicate key at the top", "dup", ndLines("dup", 1, 4) +
			`{"task":"demo.echo","task":"demo.fail","topic":"bulk","payload":{"c":"dup","n":5}}` + "\n" + ndLines("dup", 6, 7), 4, 5, `key "task" appears twice`},
		{"a duplicate key in the payload", "dup-payload", ndLines("dup-payload", 1, 1) +
			`{"task":"demo.echo","topic":"bulk","payload":{"c":"dup-payload","n":2,"x":{"a":1,"a":2}}}` + "\n", 1, 2, "appears twice"},
		{"nesting past the limit", "deep", ndLines("deep", 1, 1001) + deep("deep", 1002) + ndLines("deep", 1003, 1004), 1001, 1002, "levels deep"},
		{"a first line not UTF-8", "utf8-first",
			`{"task":"demo.echo","topic":"bulk","payload":{"c":"utf8-first","n":1,"s":"` + "\xff" + `"}}` + "\n" + ndLines("utf8-first", 2, 3), 0, 1, "UTF-8"},
		{"a first line with a duplicate key", "dup-first",
			`{"task":"demo.echo","topic":"bulk","topic":"default","payload":{"c":"dup-first","n":1}}` + "\n" + ndLines("dup-first", 2, 3), 0, 1, `key "topic" appears twice`},
		{"a first line nested past the limit", "deep-first", deep("deep-first", 1) + ndLines("deep-first", 2, 3), 0, 1, "levels deep"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := postNDJSON(t, h, strings.NewReader(tc.body))
			switch {
			case tc.stop == 0:
				if r.status != 200 || r.final["done"] != true || r.final["stored"] != float64(tc.stored) || r.final["lines"] != float64(tc.stored) {
					t.Errorf("answer %d, final line %v; want all %d lines stored", r.status, r.final, tc.stored)
				}
			case tc.stored == 0:
				var e struct {
					Error string
					Line  int
				}
				if r.status != http.StatusBadRequest || json.Unmarshal([]byte(r.body), &e) != nil || e.Line != 1 || !strings.Contains(e.Error, tc.want) {
					t.Errorf("answer %d %s; want 400 naming line 1 and saying %q", r.status, r.body, tc.want)
				}
			default:
				msg, _ := r.final["error"].(string)
				if r.status != 200 || r.final["done"] != false || r.final["line"] != float64(tc.stop) || r.final["stored"] != float64(tc.stored) ||
					!strings.Contains(msg, fmt.Sprintf("line %d: ", tc.stop)) || !strings.Contains(msg, tc.want) {
					t.Errorf("answer %d, final line %v; want line %d refused saying %q, %d lines stored", r.status, r.final, tc.stop, tc.want, tc.stored)
				}
			}
			if len(r.ids) != tc.stored {
				t.Errorf("the chunk lines name %d ids, want %d", len(r.ids), tc.stored)
			}
			if got := storedNs(t, db, tc.tag); !slices.Equal(got, oneTo(tc.stored)) {
				t.Errorf("stored lines %v; want lines 1 to %d, once each, in order", abbreviate(got), tc.stored)
			}
		})
	}
	if now := h.worker(t); now.PID != st.PID || now.State != "running" {
		t.Errorf("tasks_worker after the uploads: %+v; want it running as pid %d, never restarted", now, st.PID)
	}
}

// abbreviate shows the start and the end of a long list.
func abbreviate(ns []int) string {
	if len(ns) <= 12 {
		return fmt.Sprint(ns)
	}
	return fmt.Sprintf("%v ... %v (%d)", ns[:6], ns[len(ns)-6:], len(ns))
}

// chunkedUpload is an NDJSON upload on a raw connection, sent with chunked
// transfer encoding as the test writes it, and its answer read as it
// arrives.
type chunkedUpload struct {
	conn *net.TCPConn
	resp chan *http.Response
	bw   *bufio.Writer
}

func startChunkedUpload(t *testing.T, h *hostProc) *chunkedUpload {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	u := &chunkedUpload{conn: c.(*net.TCPConn), resp: make(chan *http.Response, 1), bw: bufio.NewWriter(c)}
	fmt.Fprintf(u.bw, "POST /plugin-pkg/tasks_worker/api/tasks/batch HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n", reaperToken)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			close(u.resp)
			return
		}
		u.resp <- resp
	}()
	return u
}

func (u *chunkedUpload) send(t *testing.T, s string) {
	t.Helper()
	fmt.Fprintf(u.bw, "%x\r\n%s\r\n", len(s), s)
	if err := u.bw.Flush(); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// answer waits for the answer's status line and headers.
func (u *chunkedUpload) answer(t *testing.T) *http.Response {
	t.Helper()
	select {
	case resp, ok := <-u.resp:
		if !ok {
			t.Fatal("the connection ended without an answer")
		}
		return resp
	case <-time.After(2 * time.Minute):
		t.Fatal("no answer within 2 minutes")
	}
	return nil
}

// cutOffLog finds tasks_worker's WARN about the upload cut off after it
// stored lines 1 to lines_stored, and returns lines_stored.
var cutOffLog = regexp.MustCompile(`cut off.*lines_stored=(\d+)`)

func cutOffStored(h *hostProc) (int, bool) {
	m := cutOffLog.FindAllStringSubmatch(h.log.String(), -1)
	if len(m) == 0 {
		return 0, false
	}
	n, err := strconv.Atoi(m[len(m)-1][1])
	return n, err == nil
}

// TestNDJSONBatchCutOrStalledThroughTheHost: an upload whose client
// vanishes (a reset mid-line) or stalls past body_timeout_seconds keeps
// the chunks it committed, whole, and nothing else: the lines stored are
// lines 1 to the count the plugin reports, and a half-sent line is never
// stored. A stalled upload's lines are stored before the cut, as the
// plugin stores a chunk when its client pauses.
func TestNDJSONBatchCutOrStalledThroughTheHost(t *testing.T) {
	schema := pgSchema(t)
	h := startHost(t, twConfig(schema, twOpts{topics: batchTopics, hostExtra: "body_timeout_seconds: 3"}))
	st, _ := h.waitWorker(t, 0)
	db := pgConn(t, schema)

	t.Run("cut", func(t *testing.T) {
		u := startChunkedUpload(t, h)
		u.send(t, ndLines("cut", 1, 2500))
		resp := u.answer(t)
		if resp.StatusCode != 200 {
			t.Fatalf("answer %d, want 200 with the chunks as they are stored", resp.StatusCode)
		}
		first, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || !strings.Contains(first, `"first_line":1`) {
			t.Fatalf("first answer line %q, %v; want the first chunk's", first, err)
		}
		// Half a line, then a reset.
		u.send(t, strings.TrimSuffix(ndLine("cut", 2501), "}}\n"))
		_ = u.conn.SetLinger(0)
		u.conn.Close()

		var stored int
		waitFor(t, 2*time.Minute, "tasks_worker logs the cut-off upload", func() bool {
			var ok bool
			stored, ok = cutOffStored(h)
			return ok
		})
		t.Logf("the plugin stored %d lines of the cut upload", stored)
		if stored < 1000 || stored > 2500 {
			t.Errorf("the plugin says it stored %d lines; want from the first chunk (1000) to the 2500 whole lines sent", stored)
		}
		if got := storedNs(t, db, "cut"); !slices.Equal(got, oneTo(stored)) {
			t.Errorf("stored lines %s; want lines 1 to %d, those of the chunks committed", abbreviate(got), stored)
		}
	})

	t.Run("stalled", func(t *testing.T) {
		u := startChunkedUpload(t, h)
		u.send(t, ndLines("stalled", 1, 1500))
		resp := u.answer(t)
		r := readNDAnswer(t, resp) // ends when the host cuts the stalled upload
		if resp.StatusCode != 200 {
			t.Fatalf("answer %d %s, want 200 with the chunks as they are stored", resp.StatusCode, r.body)
		}
		t.Logf("the stalled upload's answer: %d ids, final line %v", len(r.ids), r.final)
		if len(r.ids) != 1500 {
			t.Errorf("the chunk lines name %d ids; want the 1500 lines sent before the stall, stored when it paused", len(r.ids))
		}
		if r.final != nil && (r.final["done"] != false || r.final["stored"] != float64(1500)) {
			t.Errorf("final line %v; want the upload stopped with 1500 lines stored", r.final)
		}
		if got := storedNs(t, db, "stalled"); !slices.Equal(got, oneTo(1500)) {
			t.Errorf("stored lines %s; want lines 1 to 1500", abbreviate(got))
		}
	})

	if now := h.worker(t); now.PID != st.PID || now.State != "running" {
		t.Errorf("tasks_worker after the uploads: %+v; want it running as pid %d, never restarted", now, st.PID)
	}
}

// tinyLines yields n tiny NDJSON lines of tag without holding them, and
// calls half once it has yielded half of them.
type tinyLines struct {
	tag  string
	n, i int
	half func()
	cur  []byte
	sent int64
}

func (b *tinyLines) Read(p []byte) (int, error) {
	total := 0
	for total < len(p) {
		if len(b.cur) == 0 {
			if b.i == b.n {
				break
			}
			b.i++
			if b.i == b.n/2 && b.half != nil {
				b.half()
			}
			b.cur = fmt.Appendf(b.cur[:0], `{"task":"demo.echo","topic":"bulk","payload":{"c":%q,"n":%d}}`+"\n", b.tag, b.i)
		}
		k := copy(p[total:], b.cur)
		b.cur = b.cur[k:]
		total += k
	}
	b.sent += int64(total)
	if total == 0 {
		return 0, io.EOF
	}
	return total, nil
}

// peakRSS is a process's peak resident memory (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM of %d: %q", pid, line)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// TestAMillionTinyNDJSONLinesThroughTheHost streams a million one-task
// lines through the real host to tasks_worker: every line is stored once,
// in order, and neither process holds the upload: the peak memory of each
// is the same at the end as half-way through, and far below what holding
// the body would take.
func TestAMillionTinyNDJSONLinesThroughTheHost(t *testing.T) {
	const lines = 1_000_000
	schema := pgSchema(t)
	h := startHost(t, twConfig(schema, twOpts{topics: batchTopics}))
	st, _ := h.waitWorker(t, 0)
	db := pgConn(t, schema)

	hostPID := h.cmd.Process.Pid
	hostBefore, pluginBefore := peakRSS(t, hostPID), peakRSS(t, st.PID)
	var hostHalf, pluginHalf int64
	body := &tinyLines{tag: "million", n: lines, half: func() {
		hostHalf, pluginHalf = peakRSS(t, hostPID), peakRSS(t, st.PID)
	}}
	start := time.Now()
	r := postNDJSON(t, h, body)
	took := time.Since(start)
	if r.status != 200 || r.final["done"] != true || r.final["stored"] != float64(lines) || r.final["lines"] != float64(lines) {
		t.Fatalf("answer %d, final line %v %s; want all %d lines stored", r.status, r.final, r.body, lines)
	}
	if len(r.ids) != lines {
		t.Errorf("the chunk lines name %d ids, want %d", len(r.ids), lines)
	}
	hostAfter, pluginAfter := peakRSS(t, hostPID), peakRSS(t, st.PID)
	t.Logf("%d lines (%d MB) in %s; peak memory before, half-way and at the end: host %d, %d, %d MB; tasks_worker %d, %d, %d MB",
		lines, body.sent>>20, took.Round(time.Second), hostBefore>>20, hostHalf>>20, hostAfter>>20, pluginBefore>>20, pluginHalf>>20, pluginAfter>>20)
	// A process that held the body would grow with it, by a third of it
	// (and more for the tasks decoded from it) over the second half.
	// Streamed, each holds pieces, a chunk of 1,000 tasks per stage and
	// the stream's window: its peak is reached early and stays.
	const slack = 16 << 20
	for _, p := range []struct {
		name             string
		before, half, at int64
	}{{"the host", hostBefore, hostHalf, hostAfter}, {"tasks_worker", pluginBefore, pluginHalf, pluginAfter}} {
		if p.at-p.half > slack {
			t.Errorf("%s's peak memory grew by %d MB over the second half of a %d MB upload: it holds what it was sent", p.name, (p.at-p.half)>>20, body.sent>>20)
		}
		if p.at-p.before > 2*body.sent {
			t.Errorf("%s's peak memory grew by %d MB during a %d MB upload", p.name, (p.at-p.before)>>20, body.sent>>20)
		}
	}

	var n, distinct, lo, hi int
	var ordered bool
	if err := db.QueryRow(context.Background(), `
		SELECT count(*), count(DISTINCT n), coalesce(min(n), 0), coalesce(max(n), 0), coalesce(bool_and(ordered), true)
		FROM (SELECT (payload->>'n')::int AS n,
			(payload->>'n')::int > coalesce(lag((payload->>'n')::int) OVER (ORDER BY id), 0) AS ordered
			FROM tw_messages_all WHERE payload->>'c' = 'million') s`).Scan(&n, &distinct, &lo, &hi, &ordered); err != nil {
		t.Fatal(err)
	}
	if n != lines || distinct != lines || lo != 1 || hi != lines || !ordered {
		t.Errorf("stored %d tasks (%d distinct lines, %d to %d, in order: %t); want lines 1 to %d once each, in order", n, distinct, lo, hi, ordered, lines)
	}
}

// TestJSONBatchesWhileTasksWorkerIsSIGKILLedAreAllOrNothing: clients post
// JSON batches of 10,000 tasks through the host while tasks_worker is
// SIGKILLed again and again. A batch answered 201 is stored whole, under
// the ids it was answered; one answered 503 (never reached a plugin) is not
// stored at all; one whose outcome the host calls unknown is stored whole
// or not at all. No batch is ever stored in part.
func TestJSONBatchesWhileTasksWorkerIsSIGKILLedAreAllOrNothing(t *testing.T) {
	const size, clients, kills = 10_000, 3, 4
	schema := pgSchema(t)
	h := startHost(t, twConfig(schema, twOpts{topics: batchTopics}))
	st, _ := h.waitWorker(t, 0)
	db := pgConn(t, schema)

	type verdict struct {
		batch   string
		status  int
		unknown bool
		ids     []string
		err     error
	}
	var (
		mu       sync.Mutex
		verdicts []verdict
		stop     atomic.Bool
		wg       sync.WaitGroup
		seq      atomic.Int64
	)
	slow := &http.Client{Timeout: 5 * time.Minute}
	post := func(batch string) verdict {
		var b strings.Builder
		b.WriteByte('[')
		for i := range size {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"task":"demo.echo","topic":"bulk","payload":{"c":%q,"n":%d}}`, batch, i+1)
		}
		b.WriteByte(']')
		req, _ := http.NewRequest("POST", h.api("/tasks/batch"), strings.NewReader(b.String()))
		req.Header.Set("Authorization", "Bearer "+reaperToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := slow.Do(req)
		if err != nil {
			return verdict{batch: batch, err: err}
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		v := verdict{batch: batch, status: resp.StatusCode, unknown: resp.Header.Get("X-Taskhost-Outcome") == "unknown", err: err}
		if resp.StatusCode == http.StatusCreated {
			var ok struct{ IDs []string }
			if jerr := json.Unmarshal(raw, &ok); jerr != nil {
				v.err = fmt.Errorf("a 201 that is not the answer: %v: %.200s", jerr, raw)
			}
			v.ids = ok.IDs
		} else if v.err == nil {
			v.err = fmt.Errorf("%d %.300s", resp.StatusCode, raw)
		}
		return v
	}
	for c := range clients {
		wg.Go(func() {
			for !stop.Load() {
				v := post(fmt.Sprintf("b%d-%d", c, seq.Add(1)))
				mu.Lock()
				verdicts = append(verdicts, v)
				mu.Unlock()
				if v.status != http.StatusCreated {
					time.Sleep(100 * time.Millisecond) // the plugin is restarting
				}
			}
		})
	}
	answered := func(status int) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, v := range verdicts {
			if v.status == status {
				n++
			}
		}
		return n
	}
	for k := range kills {
		// Each kill once more batches went through since the last: the
		// kill lands among batches in flight.
		want := answered(http.StatusCreated) + clients
		waitFor(t, 5*time.Minute, fmt.Sprintf("%d batches answered 201 before kill %d", want, k+1), func() bool { return answered(http.StatusCreated) >= want })
		time.Sleep(time.Duration(50+k*150) * time.Millisecond)
		kill(t, st.PID, syscall.SIGKILL)
		st, _ = h.waitWorker(t, st.PID)
	}
	want := answered(http.StatusCreated) + clients
	waitFor(t, 5*time.Minute, "batches go through after the last kill", func() bool { return answered(http.StatusCreated) >= want })
	stop.Store(true)
	wg.Wait()

	ctx := context.Background()
	stored := map[string][]int64{}
	rows, err := db.Query(ctx, `SELECT payload->>'c', count(*), count(DISTINCT (payload->>'n')::int), array_agg(id ORDER BY (payload->>'n')::int)
		FROM tw_messages_all GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var batch string
		var n, distinct int
		var ids []int64
		if err := rows.Scan(&batch, &n, &distinct, &ids); err != nil {
			t.Fatal(err)
		}
		if n != size || distinct != size {
			t.Errorf("batch %s is stored in part: %d tasks (%d distinct items) of %d", batch, n, distinct, size)
		}
		stored[batch] = ids
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, v := range verdicts {
		ids, in := stored[v.batch]
		switch {
		case v.status == http.StatusCreated:
			counts["201"]++
			if !in {
				t.Errorf("batch %s was answered 201 and is not stored", v.batch)
				continue
			}
			if len(v.ids) != size {
				t.Errorf("batch %s was answered 201 with %d ids, want %d", v.batch, len(v.ids), size)
				continue
			}
			for i, id := range v.ids {
				if id != strconv.FormatInt(ids[i], 10) {
					t.Errorf("batch %s: item %d was answered id %s, stored as %d", v.batch, i, id, ids[i])
					break
				}
			}
		case v.unknown:
			counts["unknown outcome"]++
			if in {
				counts["unknown outcome, stored"]++
			}
		case v.status == http.StatusServiceUnavailable:
			counts["503"]++
			if in {
				t.Errorf("batch %s was answered 503 (it never reached a plugin) and is stored", v.batch)
			}
		default:
			counts[fmt.Sprintf("other: %d", v.status)]++
			var nerr net.Error
			if v.status == 0 && !errors.As(v.err, &nerr) {
				t.Errorf("batch %s: %v", v.batch, v.err)
			} else if v.status != 0 {
				t.Errorf("batch %s: answered %v; want 201, 503 or an unknown outcome", v.batch, v.err)
			}
		}
	}
	t.Logf("%d batches of %d across %d SIGKILLs: %v", len(verdicts), size, kills, counts)
	if counts["unknown outcome"]+counts["503"] == 0 {
		t.Errorf("no batch was caught by a kill: the kills must land among batches in flight")
	}
}

// TestTwoHostsRacingOneUniqueKeyStoreOneTask: two hosts on one PostgreSQL
// schema are sent, at once and many times each, the same unique keys:
// each key is stored once, and every answer names that one task, as
// created once and a duplicate everywhere else.
func TestTwoHostsRacingOneUniqueKeyStoreOneTask(t *testing.T) {
	const keys, perHost = 40, 4
	schema := pgSchema(t)
	hosts := [2]*hostProc{
		startHost(t, twConfig(schema, twOpts{topics: batchTopics})),
		startHost(t, twConfig(schema, twOpts{topics: batchTopics})),
	}
	for _, h := range hosts {
		h.waitWorker(t, 0)
	}
	db := pgConn(t, schema)
	patient := &http.Client{Timeout: 2 * time.Minute}

	type answer struct {
		host   int
		status int
		id     string
		dup    bool
		err    error
	}
	won := [2]int{}
	for k := range keys {
		key := fmt.Sprintf("race-%d", k)
		answers := make(chan answer, 2*perHost)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, h := range hosts {
			for range perHost {
				wg.Go(func() {
					<-start
					var body struct {
						ID        string `json:"id"`
						Duplicate bool   `json:"duplicate"`
					}
					status, err := callWith(patient, "POST", h.api("/tasks"), map[string]any{
						"task": "demo.echo", "topic": "bulk", "unique_key": key, "payload": map[string]any{"c": key},
					}, &body)
					answers <- answer{i, status, body.ID, body.Duplicate, err}
				})
			}
		}
		close(start)
		wg.Wait()
		close(answers)
		created, ids := 0, map[string]bool{}
		for a := range answers {
			if a.err != nil {
				t.Fatalf("key %s: %v", key, a.err)
			}
			ids[a.id] = true
			if a.status == http.StatusCreated && !a.dup {
				created++
				won[a.host]++
			} else if a.status != http.StatusOK || !a.dup {
				t.Errorf("key %s: answer %d duplicate=%t; want 201 for the one created, 200 and duplicate for the others", key, a.status, a.dup)
			}
		}
		var n int
		var stored int64
		if err := db.QueryRow(context.Background(), `SELECT count(*), coalesce(min(id), 0) FROM tw_messages_all WHERE unique_key = $1`, key).Scan(&n, &stored); err != nil {
			t.Fatal(err)
		}
		if n != 1 || created != 1 || len(ids) != 1 || !ids[strconv.FormatInt(stored, 10)] {
			t.Errorf("key %s: %d tasks stored (id %d), %d answers said created, answers named %v; want one task, created once, named by every answer", key, n, stored, created, ids)
		}
	}
	t.Logf("%d keys, each sent %d times to each host at once: created by the first host %d times, by the second %d times", keys, perHost, won[0], won[1])
}
