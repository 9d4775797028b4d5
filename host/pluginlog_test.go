package host

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/internal/testhost"
)

// badLogLines are stderr lines in hclog's JSON format with fields of the
// wrong type: go-plugin's own parser panics on each of them.
var badLogLines = []string{
	`{"@message":5,"@level":"info","n":1}`,
	`{"@level":7,"@message":"a level that is a number"}`,
	`{"@timestamp":true,"@message":"a timestamp that is a bool","@level":"warn"}`,
}

// TestStderrLogReadsEveryLine: lines of every shape are logged at their
// level with their fields; a line of the wrong shape is logged, never a
// panic; a line split across writes is read whole.
func TestStderrLogReadsEveryLine(t *testing.T) {
	var out testhost.SyncBuffer
	w := newStderrLog(hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Trace, DisableTime: true}))
	in := strings.Join(append([]string{
		`{"@message":"hello","@level":"warn","@timestamp":"2026-01-02T03:04:05.000000Z","k":"v"}`,
		`[ERROR] plain text with a level`,
		`plain text`,
		`{"not":"hclog"}`,
		`panic: boom`,
		`goroutine 1 [running]:`,
	}, badLogLines...), "\n") + "\n"
	// Written in pieces, as a pipe gives them.
	for len(in) > 0 {
		n := min(7, len(in))
		if _, err := w.Write([]byte(in[:n])); err != nil {
			t.Fatal(err)
		}
		in = in[n:]
	}
	got := out.String()
	for _, want := range []string{
		"[WARN]  hello: k=v timestamp=2026-01-02T03:04:05.000000Z",
		"[ERROR] [ERROR] plain text with a level",
		"[DEBUG] plain text",
		`[DEBUG] {"not":"hclog"}`,
		"[ERROR] panic: boom",
		"[ERROR] goroutine 1 [running]:",
		"[INFO]  5: n=1",
		`[DEBUG] {"@level":7,"@message":"a level that is a number"}`,
		"[WARN]  a timestamp that is a bool: timestamp=true",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("log lacks %q; it is:\n%s", want, got)
		}
	}
}

// TestStderrLogBoundsALine: a line longer than maxLogLine is logged in
// pieces rather than kept whole.
func TestStderrLogBoundsALine(t *testing.T) {
	var out testhost.SyncBuffer
	w := newStderrLog(hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Trace, DisableTime: true}))
	if _, err := w.Write(bytes.Repeat([]byte("x"), 3*maxLogLine)); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "[DEBUG]"); n != 3 {
		t.Fatalf("a line of 3 x %d bytes gave %d log lines, want 3", maxLogLine, n)
	}
	if len(w.line) != 0 {
		t.Fatalf("%d bytes kept after the pieces were logged", len(w.line))
	}
}

// TestABadLogLineDoesNotEndTheHost: a plugin writes log lines that crash
// go-plugin's parser on its stderr, then starts as usual. The host (in
// this process: a panic would end the test binary) runs it and logs the
// lines.
func TestABadLogLineDoesNotEndTheHost(t *testing.T) {
	dir := t.TempDir()
	elsewhere := t.TempDir()
	genuine, _ := installFixture(t, elsewhere, "noisy")
	var script strings.Builder
	script.WriteString("#!/bin/sh\n")
	for _, l := range badLogLines {
		fmt.Fprintf(&script, "echo '%s' >&2\n", l)
	}
	fmt.Fprintf(&script, "exec %s \"$@\"\n", genuine)
	if err := os.WriteFile(filepath.Join(dir, BinaryPrefix+"noisy"), []byte(script.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	var logs testhost.SyncBuffer
	h := startTestHostLogging(t, fmt.Sprintf("plugins_dir: %s\nplugins:\n  noisy:\n    enabled: true\n", dir),
		hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug}))
	s, _ := h.Plugin("noisy")
	testhost.WaitFor(t, 60*time.Second, "noisy is running or failed", func() bool {
		st := s.Status().State
		return st == StateRunning || st == StateFailed
	})
	if st := s.Status(); st.State != StateRunning {
		t.Fatalf("noisy: %+v; want it running", st)
	}
	got := logs.String()
	for _, want := range []string{"a level that is a number", "a timestamp that is a bool", ": 5: n=1"} {
		if !strings.Contains(got, want) {
			t.Errorf("the host's log lacks %q:\n%s", want, got)
		}
	}
}
