package tasksworker

// POST /api/tasks/batch: many tasks in one request. A JSON array is
// stored all or nothing; NDJSON (one task per line) is read as a stream
// and stored in chunks as it arrives, each answered by a line of the
// response.
//
// The NDJSON path is a pipeline of three goroutines, so that reading,
// checking and storing overlap: the reader reads and decodes lines, the
// handler's own goroutine gathers them into chunks and checks them
// (service.Check), and the committer stores one chunk at a time
// (service.Store) and writes its line. At most one chunk is being stored
// while the next is gathered, and chunks are stored in order.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

const (
	// ndjsonChunk is how many tasks one NDJSON chunk (one SubmitMany,
	// one transaction) holds at most.
	ndjsonChunk = 1000
	// ndjsonIdle: a chunk is stored when no line arrived for this long
	// while the body waited for the client, so that a slow producer sees
	// its tasks stored promptly.
	ndjsonIdle = 200 * time.Millisecond
)

const (
	contentJSON   = "application/json"
	contentNDJSON = "application/x-ndjson"
)

func (p *Plugin) submitBatch(w http.ResponseWriter, r *http.Request, rt *runtime) {
	ct := r.Header.Get("Content-Type")
	mt, _, _ := mime.ParseMediaType(ct)
	switch mt {
	case contentJSON:
		submitJSONBatch(w, r, rt)
	case contentNDJSON:
		p.submitNDJSON(w, r, rt)
	default:
		writeError(w, http.StatusUnsupportedMediaType, "Content-Type %q is not accepted here: send %s (a JSON array of tasks, stored all or nothing) or %s (one task per line, stored as it arrives)", ct, contentJSON, contentNDJSON)
	}
}

// lineLimit bounds one task as JSON: an item of the array or a line.
func lineLimit(rt *runtime) int { return rt.cfg.MaxPayloadBytes + service.BodySlack }

// decodeItem decodes one task strictly, as POST /api/tasks does its body;
// what names it in a refusal ("the item", "the line").
func decodeItem(data []byte, limit int, what string) (service.SubmitRequest, error) {
	if len(data) > limit {
		return service.SubmitRequest{}, fmt.Errorf("%s is %d bytes long, the limit is %d (max_payload_bytes plus %d): send a smaller payload", what, len(data), limit, service.BodySlack)
	}
	var req submitRequest
	if err := decodeJSON(data, &req, submitExample, what); err != nil {
		return service.SubmitRequest{}, err
	}
	return req.service()
}

// submitJSONBatch stores a JSON array of tasks all or nothing.
func submitJSONBatch(w http.ResponseWriter, r *http.Request, rt *runtime) {
	notArray := func() {
		writeError(w, http.StatusBadRequest, "the request body must be a JSON array of tasks, such as [%s]; or send one task per line with Content-Type %s", submitExample, contentNDJSON)
	}
	dec := json.NewDecoder(r.Body)
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		notArray()
		return
	}
	limit := lineLimit(rt)
	var reqs []service.SubmitRequest
	for i := 0; dec.More(); i++ {
		if i == broker.MaxSubmitBatch {
			writeError(w, http.StatusBadRequest, "the array holds more than %d tasks, the limit of one batch: send several batches, or send the tasks as NDJSON (Content-Type %s), which has no limit", broker.MaxSubmitBatch, contentNDJSON)
			return
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			writeItemError(w, http.StatusBadRequest, i, fmt.Errorf("the item is not valid JSON (%v); send an array of objects, such as [%s]", err, submitExample))
			return
		}
		req, err := decodeItem(raw, limit, "the item")
		if err != nil {
			writeItemError(w, http.StatusBadRequest, i, err)
			return
		}
		reqs = append(reqs, req)
	}
	if _, err := dec.Token(); err != nil {
		writeError(w, http.StatusBadRequest, "the request body is not valid JSON (%v); send an array of objects, such as [%s]", err, submitExample)
		return
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, http.StatusBadRequest, "the request body holds more than one JSON value; send one array, such as [%s]", submitExample)
		return
	}
	out, err := rt.svc.SubmitMany(r.Context(), reqs)
	var item *service.ItemError
	switch {
	case errors.As(err, &item):
		status := http.StatusBadRequest
		if p, ok := service.IsProblem(item.Err); ok {
			status = problemStatus(p)
		}
		writeItemError(w, status, item.Index, item.Err)
	case err != nil:
		writeSubmitError(w, "submit batch", err)
	default:
		answer := map[string]any{"ids": idStrings(out)}
		if dups := duplicates(out); len(dups) > 0 {
			answer["duplicates"] = dups
		}
		writeJSON(w, http.StatusCreated, answer)
	}
}

func writeItemError(w http.ResponseWriter, status, index int, err error) {
	writeJSON(w, status, map[string]any{"error": fmt.Sprintf("item %d: %v", index, err), "index": index})
}

func idStrings(s []broker.Submitted) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = strconv.FormatInt(x.ID, 10)
	}
	return out
}

// duplicates returns the indexes of the duplicates in s: their id is the
// task that holds their unique key, and nothing was stored for them.
func duplicates(s []broker.Submitted) []int {
	var out []int
	for i, x := range s {
		if x.Duplicate {
			out = append(out, i)
		}
	}
	return out
}

// ndLine is what the reader hands on: a task of line no, or the end of
// the body (eof, no is the number of lines), or the line no that stops
// the upload (err: not a task, too long, or the body could not be read,
// then cut is set).
type ndLine struct {
	no  int
	req service.SubmitRequest
	eof bool
	err error
	cut bool
}

// readLines reads the body's lines, numbered from 1, and sends a task for
// each non-blank line, then one last ndLine (eof or err). It stops early,
// when stop is closed, at its next send.
func readLines(body io.Reader, limit int, out chan<- ndLine, stop <-chan struct{}) {
	br := bufio.NewReaderSize(body, 64<<10)
	send := func(l ndLine) bool {
		select {
		case out <- l:
			return true
		case <-stop:
			return false
		}
	}
	for no := 1; ; no++ {
		line, err := readLine(br, limit)
		switch {
		case errors.Is(err, errLineTooLong):
			send(ndLine{no: no, err: fmt.Errorf("the line is over %d bytes (max_payload_bytes plus %d); send a smaller payload", limit, service.BodySlack)})
			return
		case err == io.EOF:
			send(ndLine{no: no - 1, eof: true})
			return
		case err != nil:
			send(ndLine{no: no, err: fmt.Errorf("the request body could not be read: %w", err), cut: true})
			return
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		req, derr := decodeItem(line, limit, "the line")
		if derr != nil {
			send(ndLine{no: no, err: derr})
			return
		}
		if !send(ndLine{no: no, req: req}) {
			return
		}
	}
}

// bodyReader is the request body, telling whether a read is waiting for
// the client: only then is a pause the client's, and worth storing what
// was gathered for (the idle store).
type bodyReader struct {
	r       io.Reader
	waiting atomic.Bool
}

func (b *bodyReader) Read(p []byte) (int, error) {
	b.waiting.Store(true)
	defer b.waiting.Store(false)
	return b.r.Read(p)
}

var errLineTooLong = errors.New("line too long")

// readLine reads one line without its end (\n or \r\n). A last line
// without an end is a line; after it, io.EOF. A line over limit bytes is
// errLineTooLong, read no further.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > limit+2 {
			return nil, errLineTooLong
		}
		line = append(line, frag...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF && len(line) > 0 {
			err = nil
		} else if err != nil {
			return nil, err
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		if len(line) > limit {
			return nil, errLineTooLong
		}
		return line, nil
	}
}

// ndChunk is tasks checked and ready to store: lines first to last.
type ndChunk struct {
	first, last int
	batch       service.Batch
}

// committer stores chunks in order and writes a line for each; it stops
// at the first failure.
type committer struct {
	svc *service.Service
	w   http.ResponseWriter
	ctx context.Context

	failed chan struct{} // closed when a chunk could not be stored
	// Set by the committer's goroutine, read after it ended.
	wrote            bool
	stored, lastLine int
	firstID, lastID  int64
	failLine         int
	failErr          error
	failStatus       int
	failUnknown      bool // the failed chunk may be stored
}

func (c *committer) run(chunks <-chan ndChunk) {
	for ch := range chunks {
		ids, err := c.svc.Store(c.ctx, ch.batch)
		if err != nil {
			c.failLine = ch.first
			c.failStatus = http.StatusServiceUnavailable
			switch {
			case errors.Is(err, broker.ErrOutcomeUnknown):
				// The chunk may be stored: sending it again would store
				// it twice.
				c.failUnknown = true
				c.failStatus = http.StatusBadGateway
				c.failErr = fmt.Errorf("lines %d to %d may have been stored, or not (%v): look up line %d's task before sending them again (lines with a unique_key may be sent again); the lines after them are not stored", ch.first, ch.last, err, ch.last)
			case errors.Is(err, broker.ErrInvalid):
				c.failStatus = http.StatusBadRequest
				fallthrough
			default:
				c.failErr = fmt.Errorf("lines %d to %d could not be stored (%v); they and the lines after them are not stored: send them again", ch.first, ch.last, err)
			}
			close(c.failed)
			return
		}
		if len(ids) > 0 {
			if c.stored == 0 {
				c.firstID = ids[0].ID
			}
			c.lastID = ids[len(ids)-1].ID
		}
		c.stored += len(ids)
		c.lastLine = ch.last
		c.writeChunk(ch, ids)
	}
}

func (c *committer) writeChunk(ch ndChunk, ids []broker.Submitted) {
	if !c.wrote {
		c.wrote = true
		c.w.Header().Set("Content-Type", contentNDJSON)
		c.w.Header().Set("Cache-Control", "no-store")
		c.w.WriteHeader(http.StatusOK)
	}
	b := make([]byte, 0, 48+len(ids)*12)
	b = append(b, `{"first_line":`...)
	b = strconv.AppendInt(b, int64(ch.first), 10)
	b = append(b, `,"last_line":`...)
	b = strconv.AppendInt(b, int64(ch.last), 10)
	b = append(b, `,"ids":[`...)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = strconv.AppendInt(b, id.ID, 10)
		b = append(b, '"')
	}
	b = append(b, ']')
	if dups := duplicates(ids); len(dups) > 0 {
		b = append(b, `,"duplicates":[`...)
		for i, d := range dups {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(d), 10)
		}
		b = append(b, ']')
	}
	b = append(b, "}\n"...)
	// A write error means the client is gone; the upload stops when its
	// body ends.
	_, _ = c.w.Write(b)
	if f, ok := c.w.(http.Flusher); ok {
		f.Flush()
	}
}

// submitNDJSON stores an NDJSON body in chunks as it arrives. The answer
// has one line per stored chunk and a last line saying whether all lines
// were stored or at which line the upload stopped; when it stopped before
// anything was stored, it is a plain JSON error.
func (p *Plugin) submitNDJSON(w http.ResponseWriter, r *http.Request, rt *runtime) {
	ctx := r.Context()
	lines := make(chan ndLine, 256)
	stop := make(chan struct{})
	// The reader ends by itself at the end of the body or at a bad line.
	// When the upload stops before (a bad task, a failed store), it ends
	// at its next send, or when its read returns: the server ends the
	// body when this handler returns.
	body := &bodyReader{r: r.Body}
	go readLines(body, lineLimit(rt), lines, stop)
	defer close(stop)

	c := &committer{svc: rt.svc, w: w, ctx: ctx, failed: make(chan struct{})}
	chunks := make(chan ndChunk)
	var wg sync.WaitGroup
	wg.Go(func() { c.run(chunks) })

	var (
		reqs    []service.SubmitRequest
		lineNos []int
		next    = 1 // the first line of the next chunk
		total   int // lines in the body, once it ended
		done    bool
		stopAt  int   // the line that stopped the upload
		stopErr error // why
		cut     bool  // the client went away
		last    time.Time
	)
	idle := time.NewTimer(ndjsonIdle)
	idle.Stop()
	defer idle.Stop()
	// flush checks the gathered tasks and hands those before the first
	// refused one to the committer; a refusal stops the upload there.
	flush := func() {
		if len(reqs) == 0 {
			return
		}
		b, err := rt.svc.Check(ctx, reqs)
		if n := b.Len(); n > 0 {
			select {
			case chunks <- ndChunk{first: next, last: lineNos[n-1], batch: b}:
				next = lineNos[n-1] + 1
			case <-c.failed:
			}
		}
		var item *service.ItemError
		if errors.As(err, &item) {
			stopAt, stopErr = lineNos[item.Index], item.Err
		}
		reqs, lineNos = make([]service.SubmitRequest, 0, ndjsonChunk), make([]int, 0, ndjsonChunk)
		idle.Stop()
	}
loop:
	for stopErr == nil {
		select {
		case l := <-lines:
			switch {
			case l.eof:
				flush()
				total, done = l.no, stopErr == nil
				break loop
			case l.err != nil:
				if l.cut {
					// A cut-off client: what was not stored yet is
					// dropped (its last line may be cut short too).
					stopAt, stopErr, cut = l.no, l.err, true
					break loop
				}
				flush()
				if stopErr == nil {
					stopAt, stopErr = l.no, l.err
				}
				break loop
			}
			if len(reqs) == 0 {
				idle.Reset(ndjsonIdle)
			}
			reqs, lineNos = append(reqs, l.req), append(lineNos, l.no)
			last = time.Now()
			if len(reqs) == ndjsonChunk {
				flush()
			}
		case <-idle.C:
			if wait := ndjsonIdle - time.Since(last); wait > 0 {
				idle.Reset(wait)
				continue
			}
			if len(lines) > 0 || !body.waiting.Load() {
				// Lines are on their way (this goroutine or the reader
				// was slow, not the client): not an idle client.
				idle.Reset(ndjsonIdle)
				continue
			}
			flush()
		case <-c.failed:
			break loop
		case <-ctx.Done():
			stopAt, stopErr, cut = next, fmt.Errorf("the request was canceled: %w", context.Cause(ctx)), true
			break loop
		}
	}
	close(chunks)
	wg.Wait()
	if c.failErr != nil && (stopErr == nil || c.failLine < stopAt) {
		stopAt, stopErr, done = c.failLine, c.failErr, false
		cut = cut || ctx.Err() != nil
	}
	if cut {
		// What the client sent after the last stored line is not stored.
		stopAt = c.lastLine + 1
		p.log.Warn("a batch upload (NDJSON) was cut off: the lines stored stay stored; look the last one up to resume after it",
			"lines_stored", c.stored, "last_stored_line", c.lastLine, "first_id", c.firstID, "last_id", c.lastID, "error", stopErr)
	}

	var final any
	if done {
		final = struct {
			Done   bool `json:"done"`
			Stored int  `json:"stored"`
			Lines  int  `json:"lines"`
		}{true, c.stored, total}
	} else {
		msg := fmt.Sprintf("line %d: %v", stopAt, stopErr)
		if !c.wrote && c.stored == 0 {
			status := http.StatusBadRequest
			if c.failErr != nil {
				status = c.failStatus
				if c.failUnknown {
					w.Header().Set(outcomeHeader, "unknown")
				}
			} else if p, ok := service.IsProblem(stopErr); ok {
				status = problemStatus(p)
			}
			writeJSON(w, status, map[string]any{"error": msg, "line": stopAt})
			return
		}
		final = struct {
			Done   bool   `json:"done"`
			Stored int    `json:"stored"`
			Line   int    `json:"line"`
			Error  string `json:"error"`
		}{false, c.stored, stopAt, msg}
	}
	if !c.wrote {
		w.Header().Set("Content-Type", contentNDJSON)
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
	}
	b, _ := json.Marshal(final)
	_, _ = w.Write(append(b, '\n'))
}
