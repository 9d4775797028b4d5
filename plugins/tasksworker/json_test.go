package tasksworker

import (
	"context"
	"database/sql"
	"html"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A message an earlier version stored with a payload and a result nested
// 9,999 deep (there was no depth limit) opens in the UI in bounded memory:
// shown as stored with a note and a link to the whole value, instead of
// indented (an indented line is as long as its depth: hundreds of MB).
func TestUIShowsDeepStoredJSONInBoundedMemory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	f := start(t, map[string]any{"broker": "local", "data_dir": dir})
	id := f.submit(`{"task": "demo.echo", "delay_seconds": 3600, "payload": {"small": 1}}`)

	// Write the deep values into the store directly, as an older version
	// could have: the broker refuses them now.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, LocalDBFile)+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	payload := nestedJSON(9999, `[`, `1`, `]`)                   // 20 KB, the tester's case
	result := nestedJSON(9999, `{"a":`, `1`, `}`)                // 60 KB
	report := `[` + strings.Repeat(`"abcdefgh",`, 100000) + `1]` // 1.1 MB, flat
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `UPDATE tw_messages SET payload = ?, result = ? WHERE id = ?`, payload, result, id); err != nil {
		t.Fatal(err)
	}
	// The local store keeps times in nanoseconds: a report dated in
	// another unit reads as one from 1970, which the retention pass may
	// purge before the page is read.
	now := time.Now().UnixNano()
	if _, err := db.ExecContext(ctx, `INSERT INTO tw_reports (message_id, task, topic, attempt, status, started_at, ended_at, result)
		VALUES (?, 'demo.echo', 'default', 1, 'success', ?, ?, ?)`, id, now, now, report); err != nil {
		t.Fatal(err)
	}

	var res uiResp
	got := bytesAllocated(1, func() { res = f.uiGet("/ui/tasks/" + id) })
	t.Logf("the task page allocated %d KB", got>>10)
	if got > 32<<20 {
		t.Errorf("the task page allocated %d MB, want at most 32 MB", got>>20)
	}
	body := res.text()
	if res.status != http.StatusOK {
		t.Fatalf("GET /ui/tasks/%s: %d %s", id, res.status, body)
	}
	for _, want := range []string{
		`<pre id="payload">` + payload + `</pre>`,
		"Shown as stored, not laid out: it nests arrays and objects more than 100 levels deep.",
		`href="` + uiTestPrefix + `/ui/run?from=` + id + `">the Run again form</a>`,
		`href="` + uiTestPrefix + `/api/tasks/` + id + `">GET /api/tasks/` + id + `</a>`,
		"Shown as stored, cut after 64 KB of 1.0 MB",
		`/api/reports/`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the task page lacks %.200q", want)
		}
	}
	if len(res.body) > 1<<20 {
		t.Errorf("the task page is %d bytes", len(res.body))
	}

	// The Run again form holds the whole payload, as stored.
	if form := f.uiGet("/ui/run?from=" + id); !strings.Contains(form.body, html.EscapeString(payload)) {
		t.Errorf("the Run again form does not hold the stored payload")
	}
}

// A null body, or a null item of a batch, is refused as what it is (not
// an object), not as an object missing its task.
func TestNullBodyIsNotAnObject(t *testing.T) {
	f := start(t, nil)
	for _, c := range []struct{ path, body, want string }{
		{"/api/tasks", `null`, "the request body must be a JSON object"},
		{"/api/tasks", ` null `, "the request body must be a JSON object"},
		{"/api/tasks/batch", `[{"task": "demo.echo"}, null]`, "item 1: the item must be a JSON object"},
		{"/api/schedules", `null`, "the request body must be a JSON object"},
	} {
		res := f.do("POST", c.path, c.body)
		if res.status != http.StatusBadRequest || !strings.Contains(string(res.body), c.want) {
			t.Errorf("POST %s %s: %d %s, want 400 saying %q", c.path, c.body, res.status, res.body, c.want)
		}
	}
	if res := f.do("GET", "/api/tasks", ""); !strings.Contains(string(res.body), `"tasks":[]`) {
		t.Errorf("the refused requests stored something: %s", res.body)
	}
}

// The 404 of an unknown path names every section the API routes.
func TestNotFoundNamesEveryAPISection(t *testing.T) {
	f := start(t, nil)
	res := f.do("GET", "/api/nope", "")
	if res.status != http.StatusNotFound {
		t.Fatalf("GET /api/nope: %d %s", res.status, res.body)
	}
	msg, _ := res.json(t)["error"].(string)
	for _, section := range []string{"health", "locks", "reports", "schedules", "tasks", "topics", "workers"} {
		if !strings.Contains(msg, section) {
			t.Errorf("the 404 %q does not name %s", msg, section)
		}
	}
}
