package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/taskhost/taskhost/client"
	"github.com/taskhost/taskhost/internal/testhost"
)

// hostURL is a real host TestMain starts (bin/host and tasks_worker built
// from this tree, on the local store), for the command line to talk to.
var hostURL string

func TestMain(m *testing.M) {
	testhost.Main(m, "the command-line tests", testhost.LocalTasksWorker+`      schedules:
        - {name: nightly, task: demo.echo, cron: "0 3 * * *"}
`, &hostURL)
}

// TestCommandLineOnAHost drives the real host with the commands this
// package adds or changed, flags after the arguments.
func TestCommandLineOnAHost(t *testing.T) {
	must := func(stdin string, args ...string) (string, string) {
		t.Helper()
		code, out, errOut := runCLI(stdin, append(args, "-addr", hostURL)...)
		if code != 0 {
			t.Fatalf("host %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
		}
		return out, errOut
	}

	// Submit 3,000 tasks from standard input, with their ids.
	var nd strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&nd, `{"task": "demo.echo", "payload": {"i": %d}}`+"\n", i)
	}
	out, errOut := must(nd.String(), "tasks", "submit", "-file", "-", "-ids")
	ids := strings.Fields(out)
	if len(ids) != 3000 || !strings.Contains(errOut, "stored 3000 tasks from 3000 lines of standard input") {
		t.Fatalf("submit -file -: %d ids\nstderr:\n%s", len(ids), errOut)
	}
	out, _ = must("", "tasks", "wait", ids[2999], "-timeout", "2m")
	if !strings.Contains(out, "done") || !strings.Contains(out, `{"i":2999}`) {
		t.Fatalf("tasks wait:\n%s", out)
	}
	out, _ = must("", "tasks", "get", ids[0], "-json")
	if !strings.Contains(out, `"id": "`+ids[0]+`"`) || !strings.Contains(out, `"result": {`) {
		t.Fatalf("tasks get ID -json:\n%s", out)
	}

	// A file with a bad line: the lines before it are stored.
	file := filepath.Join(t.TempDir(), "tasks.ndjson")
	if err := os.WriteFile(file, []byte("{\"task\": \"demo.echo\"}\n{\"task\": \"demo.echo\"}\n{\"task\": \"nope\"}\n{\"task\": \"demo.echo\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI("", "tasks", "submit", "-file", file, "-addr", hostURL)
	if code != 1 || !strings.Contains(errOut, "stopped at line 3") || !strings.Contains(errOut, `"nope"`) || !strings.Contains(errOut, "the 2 tasks before it are stored") {
		t.Fatalf("a bad line: exit %d\n%s", code, errOut)
	}

	// A task that fails: wait exits 1 and says how it ended.
	id, _ := must("", "tasks", "submit", "-task", "demo.fail", "-max-attempts", "1")
	code, out, errOut = runCLI("", "tasks", "wait", strings.TrimSpace(id), "-addr", hostURL)
	if code != 1 || !strings.Contains(errOut, "ended failed") && !strings.Contains(errOut, "ended dead") {
		t.Fatalf("waiting on demo.fail: exit %d\n%s\n%s", code, out, errOut)
	}

	// Topics and schedules.
	must("", "topics", "pause", "default")
	if out, _ := must("", "topics", "list"); !strings.Contains(out, "true") {
		t.Fatalf("topics list after pause:\n%s", out)
	}
	must("", "topics", "resume", "default")
	// The test makes the schedule it deletes, so that it can run again
	// against the same host (go test -count).
	if _, err := client.New(hostURL).CreateSchedule(context.Background(), client.ScheduleSpec{Name: "nightly", Task: "demo.echo", Cron: "0 3 * * *"}); err != nil && !client.IsConflict(err) {
		t.Fatalf("create the schedule nightly: %v", err)
	}
	if out, _ := must("", "schedules", "disable", "nightly"); !regexp.MustCompile(`(?m)^enabled\s+false$`).MatchString(out) {
		t.Fatalf("schedules disable:\n%s", out)
	}
	if out, _ := must("", "schedules", "get", "nightly", "-json"); !strings.Contains(out, `"enabled": false`) {
		t.Fatalf("schedules get -json after disable:\n%s", out)
	}
	must("", "schedules", "enable", "nightly")
	// Its next run shows before its first fire: the next 03:00 UTC.
	if out, _ := must("", "schedules", "list"); !regexp.MustCompile(`(?m)^nightly\s.*\s\S*T03:00:00Z\s*$`).MatchString(out) {
		t.Fatalf("schedules list: no next run for nightly before its first fire:\n%s", out)
	}
	must("", "schedules", "delete", "nightly")
	// A schedule of a task no worker runs says it waits, and why.
	if _, err := client.New(hostURL).CreateSchedule(context.Background(), client.ScheduleSpec{Name: "later", Task: "images.resize", IntervalSeconds: 3600}); err != nil && !client.IsConflict(err) {
		t.Fatalf("create the schedule later: %v", err)
	}
	if out, _ := must("", "schedules", "get", "later"); !regexp.MustCompile(`(?m)^waiting\s+since .*no live worker runs task "images.resize"`).MatchString(out) {
		t.Fatalf("schedules get of a waiting schedule:\n%s", out)
	}
	must("", "schedules", "delete", "later")
	if code, _, errOut := runCLI("", "schedules", "get", "nightly", "-addr", hostURL); code != 1 || !strings.Contains(errOut, "HTTP 404") {
		t.Fatalf("a deleted schedule: exit %d\n%s", code, errOut)
	}
}
