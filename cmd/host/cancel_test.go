package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// cancelHost answers the cancel endpoints as the tasks_worker API does:
// task 1 is queued, 2 running, 3 done; other ids are unknown. It keeps
// the bodies of POST tasks/cancel.
func cancelHost(t *testing.T) (string, func() []string) {
	var (
		mu     sync.Mutex
		bodies []string
	)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /plugin-pkg/tasks_worker/api/tasks/{id}/cancel", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch id := r.PathValue("id"); id {
		case "1":
			_, _ = io.WriteString(w, `{"id":"1","state":"cancelled"}`)
		case "2":
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, `{"id":"2","state":"running","cancel_requested":true}`)
		case "3":
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"error":"task 3 has already finished (done); there is nothing to cancel","state":"done"}`)
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":"no task with id `+id+`"}`)
		}
	})
	mux.HandleFunc("POST /plugin-pkg/tasks_worker/api/tasks/cancel", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"cancelled":4}`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), bodies...)
	}
}

func TestTasksCancel(t *testing.T) {
	addr, bodies := cancelHost(t)
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{name: "a queued task", args: []string{"tasks", "cancel", "1", "-addr", addr}, stdout: "task 1 cancelled"},
		{name: "a running task is asked to stop", args: []string{"tasks", "cancel", "-addr", addr, "2"}, stdout: "task 2 is running: it is asked to stop"},
		{name: "a finished task: the host's message and exit 1", args: []string{"tasks", "cancel", "3", "-addr", addr}, code: 1, stderr: "already finished (done)"},
		{name: "an unknown task", args: []string{"tasks", "cancel", "4", "-addr", addr}, code: 1, stderr: "no task with id 4"},
		{name: "-json prints the answer", args: []string{"tasks", "cancel", "2", "-json", "-addr", addr}, stdout: `"cancel_requested": true`},
		{name: "the queued tasks of a topic and task", args: []string{"tasks", "cancel", "-topic", "emails", "-task", "send", "-addr", addr}, stdout: "cancelled 4 queued task(s)"},
		{name: "nothing named", args: []string{"tasks", "cancel", "-addr", addr}, code: 2, stderr: "say what to cancel"},
		{name: "an ID and a filter", args: []string{"tasks", "cancel", "1", "-topic", "emails", "-addr", addr}, code: 2, stderr: "not both"},
		{name: "two IDs", args: []string{"tasks", "cancel", "1", "2", "-addr", addr}, code: 2, stderr: "takes 1 argument(s)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLI("", c.args...)
			if code != c.code || !strings.Contains(out, c.stdout) || !strings.Contains(errOut, c.stderr) {
				t.Fatalf("host %s: exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
					strings.Join(c.args, " "), code, out, errOut, c.code, c.stdout, c.stderr)
			}
		})
	}
	got := bodies()
	if len(got) != 1 {
		t.Fatalf("POST tasks/cancel bodies %q, want one", got)
	}
	var f map[string]string
	if err := json.Unmarshal([]byte(got[0]), &f); err != nil || f["topic"] != "emails" || f["task"] != "send" || len(f) != 2 {
		t.Fatalf("POST tasks/cancel body %q, want the topic and the task", got[0])
	}
}
