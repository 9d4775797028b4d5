package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Chunk is one committed chunk of a batch upload, as the host reports it:
// lines FirstLine to LastLine (from 1) are stored, with these ids (one per
// non-blank line, in order). Duplicates are the indexes into IDs of the
// lines that were duplicates (see Task.UniqueKey): nothing was stored for
// them and their id is the task that holds their key.
type Chunk struct {
	FirstLine  int      `json:"first_line"`
	LastLine   int      `json:"last_line"`
	IDs        []string `json:"ids"`
	Duplicates []int    `json:"duplicates,omitempty"`
}

// BatchResult is what a batch upload stored.
type BatchResult struct {
	// Stored is how many tasks are stored.
	Stored int
	// Lines is how many lines the host read (when it read them all).
	Lines int
	// IDs are the stored tasks' ids in order; only SubmitTasks fills
	// them (the others leave them to the progress callback, so that a
	// batch of millions is never held in memory).
	IDs []string
	// Duplicates are the indexes into IDs of the duplicates (only
	// SubmitTasks fills them); Stored counts them too.
	Duplicates []int
}

// BatchOption changes a batch upload.
type BatchOption func(*batchConfig)

type batchConfig struct {
	progress func(Chunk)
	keepIDs  bool
}

// WithProgress calls fn with each chunk as the host commits it, in order,
// from the goroutine that called the Submit method.
func WithProgress(fn func(Chunk)) BatchOption {
	return func(b *batchConfig) { b.progress = fn }
}

// SubmitBatch stores the tasks seq yields, streamed to the host as NDJSON
// (one task a line, never the whole batch in memory) and stored in
// chunks of up to 1,000 as they arrive, each chunk in one transaction, in
// order. Line K is the K-th task. A task the host refuses stops the upload
// there: every task before it is stored, and the error is a *BatchError
// naming the line. When the upload ends, seq's yield returns false.
//
// SubmitBatch is never retried (seq cannot be replayed). A connection that
// breaks mid-upload returns an error that wraps ErrOutcomeUnknown, with
// the result counting what the host said it stored: the chunk being
// stored at the break may be stored too.
func (c *Client) SubmitBatch(ctx context.Context, seq iter.Seq[Task], opts ...BatchOption) (BatchResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	fw := &flushWriter{bw: bufio.NewWriterSize(pw, 64<<10)}
	var wg sync.WaitGroup
	wg.Add(2)
	stop := make(chan struct{})
	go func() { // the encoder: seq to the pipe
		defer wg.Done()
		enc := json.NewEncoder(fw)
		var err error
		for t := range seq {
			if err = ctx.Err(); err != nil {
				break
			}
			if err = fw.encode(enc, itemOf(t)); err != nil {
				break
			}
		}
		if err == nil {
			err = fw.flush()
		}
		if err != nil {
			pw.CloseWithError(err)
		} else {
			pw.Close()
		}
	}()
	go func() { // a producer slower than the buffer still sends promptly
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = fw.flush()
			}
		}
	}()
	res, err := c.submitStream(ctx, pr, opts)
	// The upload is over: stop the encoder (its next write fails) and the
	// flusher, and wait for both.
	pr.CloseWithError(errUploadEnded)
	close(stop)
	cancel()
	wg.Wait()
	return res, err
}

var errUploadEnded = errors.New("the upload ended")

// flushWriter is a buffered writer flushed by the encoder when full and
// by a ticker when the producer is slow.
type flushWriter struct {
	mu sync.Mutex
	bw *bufio.Writer
}

func (f *flushWriter) Write(p []byte) (int, error) { return f.bw.Write(p) } // under mu, from encode

func (f *flushWriter) encode(enc *json.Encoder, v any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return enc.Encode(v)
}

func (f *flushWriter) flush() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bw.Flush()
}

// SubmitTasks stores tasks as SubmitBatch does, and returns every id in
// BatchResult.IDs.
func (c *Client) SubmitTasks(ctx context.Context, tasks []Task, opts ...BatchOption) (BatchResult, error) {
	return c.SubmitBatch(ctx, slices.Values(tasks), append(opts, func(b *batchConfig) { b.keepIDs = true })...)
}

// SubmitNDJSON sends r, NDJSON of tasks (the objects Submit sends, one a
// line; blank lines count in the numbering but are skipped), as it is:
// the host checks every line. It is read as it is sent, never whole. As
// SubmitBatch, it stops at the first bad line with a *BatchError, and is
// never retried.
func (c *Client) SubmitNDJSON(ctx context.Context, r io.Reader, opts ...BatchOption) (BatchResult, error) {
	return c.submitStream(ctx, r, opts)
}

// batchLine is one line of the streamed answer: a chunk, or the final
// line (Done set).
type batchLine struct {
	Chunk
	Done   *bool  `json:"done"`
	Stored int    `json:"stored"`
	Lines  int    `json:"lines"`
	Line   int    `json:"line"`
	Error  string `json:"error"`
}

func (c *Client) submitStream(ctx context.Context, body io.Reader, opts []BatchOption) (BatchResult, error) {
	var cfg batchConfig
	for _, o := range opts {
		o(&cfg)
	}
	var res BatchResult
	r := request{method: http.MethodPost, path: apiPrefix + "/tasks/batch"}
	resp, err := c.send(ctx, r, body, "application/x-ndjson")
	if err != nil {
		if notSent(err) {
			return res, fmt.Errorf("cannot reach the host at %s (is it running? is the address right?): %w; nothing was sent", c.base, err)
		}
		return res, c.describe(r, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		ae := apiError(resp, data)
		var bad struct {
			Line int `json:"line"`
		}
		if resp.StatusCode == http.StatusBadRequest && json.Unmarshal(data, &bad) == nil && bad.Line > 0 {
			return res, &BatchError{Line: bad.Line, Message: ae.Message}
		}
		if resp.StatusCode == http.StatusNotFound {
			ae.Message += " (does the host's tasks_worker take batch uploads? it needs a version with POST api/tasks/batch)"
		}
		return res, ae
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var l batchLine
		if err := dec.Decode(&l); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return res, fmt.Errorf("POST %s: %w: the answer ended after %d stored tasks without its final line (%w); the tasks after them may be stored or not",
				r.path, ErrOutcomeUnknown, res.Stored, err)
		}
		if l.Done != nil {
			res.Stored = l.Stored
			if *l.Done {
				res.Lines = l.Lines
				return res, nil
			}
			return res, &BatchError{Line: l.Line, Stored: l.Stored, Message: l.Error}
		}
		res.Stored += len(l.IDs)
		if cfg.keepIDs {
			for _, d := range l.Duplicates {
				res.Duplicates = append(res.Duplicates, len(res.IDs)+d)
			}
			res.IDs = append(res.IDs, l.IDs...)
		}
		if cfg.progress != nil {
			cfg.progress(l.Chunk)
		}
	}
}
