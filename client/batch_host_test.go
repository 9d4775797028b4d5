package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/client"
)

// TestSubmitBatchOnAHost: 5,000 tasks streamed to the real host are all
// stored, reported chunk by chunk in order, and run.
func TestSubmitBatchOnAHost(t *testing.T) {
	c := client.New(hostURL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 5000
	tasks := make([]client.Task, n)
	for i := range tasks {
		tasks[i] = client.Task{Task: "demo.echo", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	var chunks, last int
	res, err := c.SubmitTasks(ctx, tasks, client.WithProgress(func(ch client.Chunk) {
		chunks++
		if ch.FirstLine != last+1 || ch.LastLine < ch.FirstLine || len(ch.IDs) != ch.LastLine-ch.FirstLine+1 {
			t.Errorf("chunk %d: lines %d-%d with %d ids after line %d", chunks, ch.FirstLine, ch.LastLine, len(ch.IDs), last)
		}
		last = ch.LastLine
	}))
	if err != nil || res.Stored != n || res.Lines != n || len(res.IDs) != n || last != n || chunks < n/1000 {
		t.Fatalf("SubmitTasks: %d stored, %d lines, %d ids, %d chunks up to line %d, %v", res.Stored, res.Lines, len(res.IDs), chunks, last, err)
	}
	seen := map[string]bool{}
	for _, id := range res.IDs {
		seen[id] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct ids of %d", len(seen), n)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		got, err := c.Wait(ctx, res.IDs[i])
		if err != nil || got.State != client.StateDone || string(got.Result) != fmt.Sprintf(`{"i":%d}`, i) {
			t.Fatalf("task %d (id %s): %+v, %v; want done with its own payload", i, res.IDs[i], got, err)
		}
	}
}

// TestSubmitBatchStopsAtABadLine: a bad line stops the upload there; the
// lines before it are stored, and the error names the line.
func TestSubmitBatchStopsAtABadLine(t *testing.T) {
	c := client.New(hostURL)
	ctx := context.Background()
	var b strings.Builder
	for i := 1; i <= 3000; i++ {
		if i == 2500 {
			b.WriteString(`{"task": "no.such.task"}` + "\n")
			continue
		}
		fmt.Fprintf(&b, `{"task": "demo.echo", "payload": {"line": %d}, "delay_seconds": 3600}`+"\n", i)
	}
	stored := 0
	res, err := c.SubmitNDJSON(ctx, strings.NewReader(b.String()), client.WithProgress(func(ch client.Chunk) { stored += len(ch.IDs) }))
	var be *client.BatchError
	if !errors.As(err, &be) || be.Line != 2500 || be.Stored != 2499 || res.Stored != 2499 || stored != 2499 || !strings.Contains(be.Message, "line 2500") || !strings.Contains(be.Message, "no.such.task") {
		t.Fatalf("got %+v, %v (%d reported stored); want a *BatchError at line 2500 with 2499 stored", res, err, stored)
	}

	// A bad first line stores nothing, whichever form the answer takes.
	res, err = c.SubmitNDJSON(ctx, strings.NewReader("\n{\"task\": \"demo.echo\", \"bogus\": 1}\n"))
	if !errors.As(err, &be) || be.Line != 2 || res.Stored != 0 || !strings.Contains(be.Message, "bogus") {
		t.Fatalf("a bad first line: %+v, %v; want a *BatchError at line 2 (blank lines count), nothing stored", res, err)
	}
}
