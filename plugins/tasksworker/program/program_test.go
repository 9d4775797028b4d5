package program_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/internal/testhost"
)

// TestAProgramsOwnTasksRunInTheTasksWorkerProcess: a program of one's own
// built on Main with a task linked in (testdata/owntasks), put in the
// plugins directory as fp-plugin-tasks_worker, runs under the real host:
// its task runs in the tasks_worker process itself, the built-in tasks
// still run, and the host's migrate command still reaches the program.
func TestAProgramsOwnTasksRunInTheTasksWorkerProcess(t *testing.T) {
	dir := t.TempDir()
	if err := testhost.Build(dir); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "plugins", "fp-plugin-tasks_worker"), "./testdata/owntasks")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./testdata/owntasks: %v\n%s", err, out)
	}
	log := &testhost.SyncBuffer{}
	url, stop, err := testhost.Start(dir, testhost.LocalTasksWorker, log)
	if err != nil {
		t.Fatalf("start the host: %v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("host log:\n%s", log.String())
		}
	})
	api := url + "/plugin-pkg/tasks_worker/api"

	var health struct {
		WorkerID string `json:"worker_id"`
	}
	getJSON(t, api+"/health", &health)

	id := submit(t, api, "own.pid")
	var got struct {
		State  string `json:"state"`
		Result struct {
			PID int `json:"pid"`
		} `json:"result"`
	}
	waitFor(t, 60*time.Second, "own.pid is done", func() bool {
		getJSON(t, api+"/tasks/"+id, &got)
		return got.State == "done"
	})
	// A worker id holds the process's id: "<host>-<pid>-...".
	if !strings.Contains(health.WorkerID, fmt.Sprintf("-%d-", got.Result.PID)) {
		t.Errorf("own.pid ran in process %d, not in tasks_worker's (worker %s)", got.Result.PID, health.WorkerID)
	}

	echo := submit(t, api, "demo.echo")
	waitFor(t, 60*time.Second, "demo.echo is done", func() bool {
		getJSON(t, api+"/tasks/"+echo, &got)
		return got.State == "done"
	})

	// The subcommands are the program's too: the host hands migrate on
	// to it, which answers (here that it has no database to migrate: the
	// config's broker is the local store).
	migrate := exec.Command(filepath.Join(dir, "host"), "migrate", "-config", filepath.Join(dir, "taskhost.yaml"))
	out, err := migrate.CombinedOutput()
	if code := migrate.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), "host migrate: no database") {
		t.Errorf("host migrate through the program: exit %d (%v), want 2 and its answer\n%s", code, err, out)
	}
}

func submit(t *testing.T, api, task string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"task": task})
	resp, err := http.Post(api+"/tasks", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &out) != nil || out.ID == "" {
		t.Fatalf("submit %s: %d %s", task, resp.StatusCode, b)
	}
	return out.ID
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, b)
	}
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
