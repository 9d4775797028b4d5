package main

// `host tasks submit`: one task from flags, or a stream of NDJSON from a
// file or standard input with a progress line.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/taskhost/taskhost/client"
)

func tasksSubmit(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	task := fs.String("task", "", "task `NAME` (one task; required without -file)")
	topic := fs.String("topic", "", "`TOPIC` (default: the task's own)")
	payload := fs.String("payload", "{}", "payload, a `JSON` value")
	delay := fs.Float64("delay", 0, "`SECONDS` before it may run")
	maxAttempts := fs.Int("max-attempts", 0, "`N` tries at most (0: the task's default)")
	priority := fs.Int("priority", 0, "`N` from -100 to 100: a higher priority runs first (default 0)")
	runAt := fs.String("run-at", "", "`TIME` (RFC 3339, such as 2026-12-24T18:00:00Z) before which it may not run; not with -delay")
	uniqueKey := fs.String("unique-key", "", "`KEY`: store nothing, and print the id of the task that holds it, while another task with this key is queued or running (or in -unique-states, or created within -unique-for)")
	uniqueFor := fs.Float64("unique-for", 0, "`SECONDS`: with -unique-key, a task with the key created less than this long ago holds it whatever its state")
	uniqueStates := fs.String("unique-states", "", "`STATES`, comma-separated: with -unique-key, the states in which a task holds its key (default queued,running; both are required)")
	file := fs.String("file", "", "`FILE` of NDJSON to stream, one task a line; - for standard input")
	ids := fs.Bool("ids", false, "with -file: print the ids of the stored tasks, one a line")
	return func(ctx context.Context, e *env, _ []string) error {
		if *file != "" {
			set := map[string]bool{}
			fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
			for _, name := range []string{"task", "topic", "payload", "delay", "max-attempts", "priority", "run-at", "unique-key", "unique-for", "unique-states"} {
				if set[name] {
					return usageError{fmt.Sprintf("-%s and -file do not go together: with -file each line gives its task's fields", name)}
				}
			}
			return e.submitFile(ctx, *file, *ids)
		}
		if *ids {
			return usageError{"-ids goes only with -file: a single task's id is printed anyway"}
		}
		if *task == "" {
			return usageError{"-task NAME or -file FILE is required"}
		}
		if !json.Valid([]byte(*payload)) {
			return usageError{fmt.Sprintf("-payload is not valid JSON: %s", *payload)}
		}
		t := client.Task{Task: *task, Topic: *topic, Payload: json.RawMessage(*payload), DelaySeconds: *delay, MaxAttempts: *maxAttempts,
			Priority: *priority, UniqueKey: *uniqueKey, UniqueForSeconds: *uniqueFor}
		if *runAt != "" {
			at, err := time.Parse(time.RFC3339Nano, *runAt)
			if err != nil {
				return usageError{fmt.Sprintf("-run-at %q is not an RFC 3339 time such as 2026-12-24T18:00:00Z", *runAt)}
			}
			t.RunAt = &at
		}
		if *uniqueStates != "" {
			t.UniqueStates = strings.Split(*uniqueStates, ",")
		}
		id, dup, err := e.c.SubmitUnique(ctx, t)
		if err != nil {
			return err
		}
		if e.json {
			if dup {
				return e.printJSON(map[string]any{"id": id, "duplicate": true})
			}
			return e.printJSON(map[string]string{"id": id})
		}
		fmt.Fprintln(e.stdout, id)
		if dup {
			fmt.Fprintf(e.stderr, "duplicate: task %s holds unique key %q; nothing was stored\n", id, *uniqueKey)
		}
		return nil
	}
}

// submitFile streams the NDJSON at path ("-": standard input) and reports
// progress on standard error.
func (e *env) submitFile(ctx context.Context, path string, printIDs bool) error {
	in, name := e.stdin, "standard input"
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		in, name = f, path
	}
	out := bufio.NewWriter(e.stdout)
	defer out.Flush()
	p := newProgress(e.stderr)
	res, err := e.c.SubmitNDJSON(ctx, bufio.NewReaderSize(in, 256<<10), client.WithProgress(func(ch client.Chunk) {
		if printIDs {
			for _, id := range ch.IDs {
				fmt.Fprintln(out, id)
			}
		}
		p.chunk(ch)
	}))
	p.done()
	var be *client.BatchError
	switch {
	case errors.As(err, &be):
		return fmt.Errorf("%s: stopped at line %d: %s; the %d tasks before it are stored, nothing from it on: fix line %d and send the lines from it on again (tail -n +%d)",
			name, be.Line, be.Message, be.Stored, be.Line, be.Line)
	case errors.Is(err, client.ErrOutcomeUnknown):
		return fmt.Errorf("%s: %w; %d tasks are known to be stored (the last chunk reported ended at line %d)", name, err, p.stored, p.lastLine)
	case err != nil:
		return fmt.Errorf("%s: %w (%d tasks stored, up to line %d)", name, err, p.stored, p.lastLine)
	}
	if e.json {
		return e.printJSON(map[string]any{"stored": res.Stored, "lines": res.Lines})
	}
	el := time.Since(p.start)
	fmt.Fprintf(e.stderr, "stored %d tasks from %d lines of %s in %s (%.0f/s)\n", res.Stored, res.Lines, name, el.Round(time.Millisecond), float64(res.Stored)/el.Seconds())
	return nil
}

// progress is the line "stored N tasks, R/s" on standard error: redrawn
// in place on a terminal (at most 10 times a second), a new line every
// second otherwise.
type progress struct {
	w                io.Writer
	tty              bool
	start, last      time.Time
	stored, lastLine int
	drawn            bool
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w, start: time.Now()}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	p.last = p.start
	return p
}

func (p *progress) chunk(ch client.Chunk) {
	p.stored += len(ch.IDs)
	p.lastLine = ch.LastLine
	now := time.Now()
	every := time.Second
	if p.tty {
		every = 100 * time.Millisecond
	}
	if now.Sub(p.last) < every {
		return
	}
	p.last = now
	rate := float64(p.stored) / now.Sub(p.start).Seconds()
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[Kstored %d tasks, %.0f/s", p.stored, rate)
		p.drawn = true
	} else {
		fmt.Fprintf(p.w, "stored %d tasks, %.0f/s\n", p.stored, rate)
	}
}

// done clears the progress line on a terminal.
func (p *progress) done() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
