package tasksworker

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// countTasks returns how many tasks p's broker stores.
func countTasks(t *testing.T, p *Plugin) int {
	t.Helper()
	msgs, err := p.current().broker.ListMessages(context.Background(), broker.MessageFilter{Limit: broker.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	return len(msgs)
}

func decodeAnswer(t *testing.T, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("answer %q: %v", rec.Body, err)
	}
	return m
}

// POST /api/tasks and the batches take unique keys, priorities and run-at
// times: a duplicate answers 200 with the holder's id, batches flag their
// duplicates, and GET shows what was stored.
func TestIntakeAPI(t *testing.T) {
	for store, cfg := range batchStores {
		t.Run(store, func(t *testing.T) {
			p := startPaused(t, testLogger(t), cfg(t))
			post := func(path, ct, body string) *httptest.ResponseRecorder {
				return serve(p, "POST", path, ct, strings.NewReader(body))
			}
			at := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
			rec := post("/api/tasks", "application/json",
				`{"task": "demo.echo", "unique_key": "order-1", "priority": 5, "run_at": "`+at.Format(time.RFC3339)+`"}`)
			if rec.Code != http.StatusCreated {
				t.Fatalf("first keyed submit: %d %s", rec.Code, rec.Body)
			}
			id := decodeAnswer(t, rec)["id"].(string)
			got := serve(p, "GET", "/api/tasks/"+id, "", nil)
			view := decodeAnswer(t, got)
			if view["priority"] != 5.0 || view["unique_key"] != "order-1" || view["available_at"] != at.Format(time.RFC3339) {
				t.Fatalf("GET task = %s, want priority 5, unique_key order-1, available_at %s", got.Body, at.Format(time.RFC3339))
			}
			rec = post("/api/tasks", "application/json", `{"task": "demo.echo", "unique_key": "order-1", "unique_for_seconds": 60}`)
			if ans := decodeAnswer(t, rec); rec.Code != http.StatusOK || ans["id"] != id || ans["duplicate"] != true {
				t.Fatalf("duplicate submit: %d %s, want 200 {\"id\": %q, \"duplicate\": true}", rec.Code, rec.Body, id)
			}
			if n := countTasks(t, p); n != 1 {
				t.Fatalf("%d tasks after a duplicate, want 1", n)
			}

			// A JSON batch: a repeated key collapses to its first item, a
			// held key names its holder.
			rec = post("/api/tasks/batch", "application/json",
				`[{"task": "demo.echo", "unique_key": "order-1"}, {"task": "demo.echo", "unique_key": "b"}, {"task": "demo.echo", "unique_key": "b", "priority": -3}, {"task": "demo.echo"}]`)
			var batch struct {
				IDs        []string `json:"ids"`
				Duplicates []int    `json:"duplicates"`
			}
			if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &batch) != nil || len(batch.IDs) != 4 {
				t.Fatalf("keyed batch: %d %s", rec.Code, rec.Body)
			}
			if !slices.Equal(batch.Duplicates, []int{0, 2}) || batch.IDs[0] != id || batch.IDs[2] != batch.IDs[1] {
				t.Fatalf("keyed batch answered %s, want duplicates [0 2], item 0 = %s, item 2 = item 1", rec.Body, id)
			}
			if n := countTasks(t, p); n != 3 {
				t.Fatalf("%d tasks after the batch, want 3", n)
			}

			// NDJSON: duplicates are flagged per chunk line.
			rec = post("/api/tasks/batch", "application/x-ndjson",
				"{\"task\": \"demo.echo\", \"unique_key\": \"c\"}\n{\"task\": \"demo.echo\", \"unique_key\": \"c\"}\n{\"task\": \"demo.echo\", \"unique_key\": \"b\"}\n")
			a := parseNDAnswer(t, rec.Body.Bytes())
			if len(a.chunks) != 1 || !slices.Equal(a.chunks[0].Duplicates, []int{1, 2}) || a.chunks[0].IDs[2] != batch.IDs[1] {
				t.Fatalf("NDJSON with keys answered %s, want one chunk with duplicates [1 2]", rec.Body)
			}
			if n := countTasks(t, p); n != 4 {
				t.Fatalf("%d tasks after the NDJSON upload, want 4", n)
			}
		})
	}
}

// Bad unique keys, priorities and run-at times are refused with a 400
// that names the field, in POST /api/tasks and in batches, and store
// nothing.
func TestIntakeBadInput(t *testing.T) {
	p := startPaused(t, testLogger(t), batchStores["local"](t))
	far := time.Now().Add(broker.MaxDelay + 48*time.Hour).UTC().Format(time.RFC3339)
	past := time.Now().Add(-25 * time.Hour).UTC().Format(time.RFC3339)
	soon := time.Now().Add(time.Minute).UTC().Format(time.RFC3339)
	cases := []struct{ name, fields, want string }{
		{"empty key", `"unique_key": ""`, "unique_key is empty"},
		{"long key", `"unique_key": "` + strings.Repeat("k", broker.MaxUniqueKeyLen+1) + `"`, "unique_key is 201 bytes long, the limit is 200"},
		{"priority too high", `"priority": 101`, "priority is 101, it must be between -100 and 100"},
		{"priority too low", `"priority": -101`, "priority is -101"},
		{"run_at not a time", `"run_at": "tomorrow"`, `run_at "tomorrow" is not an RFC 3339 time`},
		{"run_at far past", `"run_at": "` + past + `"`, "more than 24 hours in the past"},
		{"run_at beyond the limit", `"run_at": "` + far + `"`, "the limit is"},
		{"run_at with delay", `"run_at": "` + soon + `", "delay_seconds": 5`, "run_at and delay_seconds are both set"},
		{"unknown unique state", `"unique_key": "k", "unique_states": ["queued", "running", "sleeping"]`, `unknown state "sleeping"`},
		{"states without running", `"unique_key": "k", "unique_states": ["queued"]`, "must include queued and running"},
		{"empty states", `"unique_key": "k", "unique_states": []`, "unique_states is empty: it must include queued and running"},
		{"empty states without a key", `"unique_states": []`, "unique_states is empty"},
		{"a state twice", `"unique_key": "k", "unique_states": ["queued", "running", "queued"]`, `names "queued" twice`},
		{"negative window", `"unique_key": "k", "unique_for_seconds": -1`, "unique_for_seconds must be from 0"},
		{"window without key", `"unique_for_seconds": 60`, "without a unique_key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			item := `{"task": "demo.echo", ` + c.fields + `}`
			for _, r := range []struct{ path, ct, body string }{
				{"/api/tasks", "application/json", item},
				{"/api/tasks/batch", "application/json", `[{"task": "demo.echo", "unique_key": "fine"}, ` + item + `]`},
				{"/api/tasks/batch", "application/x-ndjson", item + "\n"},
			} {
				rec := serve(p, "POST", r.path, r.ct, strings.NewReader(r.body))
				msg, _ := decodeAnswer(t, rec)["error"].(string)
				if rec.Code != http.StatusBadRequest || !strings.Contains(msg, c.want) {
					t.Errorf("%s %s: %d %s, want 400 saying %q", r.path, r.ct, rec.Code, rec.Body, c.want)
				}
			}
		})
	}
	if n := countTasks(t, p); n != 0 {
		t.Fatalf("bad requests stored %d tasks", n)
	}
}

// A schedule takes a unique key through the API, and keeps it.
func TestScheduleUniqueKeyAPI(t *testing.T) {
	p := startPaused(t, testLogger(t), batchStores["local"](t))
	rec := serve(p, "POST", "/api/schedules", "application/json",
		strings.NewReader(`{"name": "keyed", "task": "demo.echo", "interval_seconds": 3600, "unique_key": "hourly"}`))
	if rec.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	rec = serve(p, "GET", "/api/schedules/keyed", "", nil)
	if !strings.Contains(rec.Body.String(), `"unique_key":"hourly"`) {
		t.Fatalf("GET schedule = %s, want its unique key", rec.Body)
	}
	rec = serve(p, "POST", "/api/schedules", "application/json",
		strings.NewReader(`{"name": "long", "task": "demo.echo", "interval_seconds": 3600, "unique_key": "`+strings.Repeat("k", 201)+`"}`))
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "unique_key is 201 bytes long") {
		t.Fatalf("a long key: %d %s, want 400 naming unique_key", rec.Code, rec.Body)
	}
	// An empty key is refused as a submit's is, not dropped.
	rec = serve(p, "POST", "/api/schedules", "application/json",
		strings.NewReader(`{"name": "empty", "task": "demo.echo", "interval_seconds": 3600, "unique_key": ""}`))
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "unique_key is empty") {
		t.Fatalf("an empty key: %d %s, want 400 saying unique_key is empty", rec.Code, rec.Body)
	}
	if rec = serve(p, "GET", "/api/schedules/empty", "", nil); rec.Code != http.StatusNotFound {
		t.Fatalf("the refused schedule: %d %s, want 404", rec.Code, rec.Body)
	}
	err := New(testLogger(t)).CheckConfig(json.RawMessage(`{"schedules": [{"name": "empty", "task": "demo.echo", "interval_seconds": 60, "unique_key": ""}]}`))
	if err == nil || !strings.Contains(err.Error(), "schedules[0]") || !strings.Contains(err.Error(), "unique_key is empty") {
		t.Fatalf("check-config of an empty key: %v, want an error naming schedules[0]", err)
	}
}
