package tasksworker

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

// restart configures the plugin again with config, as a restarted
// process does: the runtime is rebuilt on the same store.
func (f *fixture) restart(config map[string]any) {
	f.t.Helper()
	raw, err := json.Marshal(config)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.client.Configure(context.Background(), capability.ConfigureRequest{Config: raw, Host: &capabilitytest.Host{}}); err != nil {
		f.t.Fatalf("configure again: %v", err)
	}
}

func (f *fixture) topicPaused(name string) bool {
	f.t.Helper()
	res := f.do("GET", "/api/topics", "")
	var body struct {
		Topics []struct {
			Name   string `json:"name"`
			Paused bool   `json:"paused"`
		} `json:"topics"`
	}
	if err := json.Unmarshal(res.body, &body); err != nil || res.status != http.StatusOK {
		f.t.Fatalf("GET topics: %d %s", res.status, res.body)
	}
	for _, tp := range body.Topics {
		if tp.Name == name {
			return tp.Paused
		}
	}
	f.t.Fatalf("no topic %q in %s", name, res.body)
	return false
}

// TestARestartNeverUndoesAnOperator: a topic paused in the config is
// paused when it is first set up; an operator resumes it; the restarted
// plugin keeps it resumed, and the paused gauge follows the stored state.
// Only enforce: true applies the config over the stored settings.
func TestARestartNeverUndoesAnOperator(t *testing.T) {
	dir := t.TempDir()
	config := func(topic map[string]any) map[string]any {
		return map[string]any{"broker": "local", "data_dir": dir, "drain_timeout_seconds": 0, "topics": map[string]any{"burn": topic}}
	}
	f := start(t, config(map[string]any{"paused": true}))
	if !f.topicPaused("burn") {
		t.Fatal("a new topic paused in the config is not paused")
	}
	id := f.submit(`{"task": "demo.echo", "topic": "burn"}`)
	fams := f.scrape()
	if got := value(fams, "fastpluggy_broker_topic_paused", "topic", "burn"); got != 1 {
		t.Errorf("paused gauge of the paused topic = %v, want 1", got)
	}
	if got := value(fams, "fastpluggy_broker_topic_queued", "topic", "burn"); got != 1 {
		t.Errorf("queued gauge of the paused topic = %v, want 1", got)
	}
	for _, page := range []string{"/ui/", "/ui/topics"} {
		if body := f.uiGet(page).body; !strings.Contains(body, `paused-queue`) || !strings.Contains(body, "1 waiting") {
			t.Errorf("%s does not show that 1 message waits on the paused topic", page)
		}
	}

	if res := f.do("PUT", "/api/topics/burn", `{"paused": false}`); res.status != http.StatusOK {
		t.Fatalf("resume: %d %s", res.status, res.body)
	}
	f.waitState(id, "done")

	f.restart(config(map[string]any{"paused": true}))
	if f.topicPaused("burn") {
		t.Fatal("the restart paused again a topic the operator resumed")
	}
	if got := value(f.scrape(), "fastpluggy_broker_topic_paused", "topic", "burn"); got != 0 {
		t.Errorf("paused gauge of the resumed topic = %v, want 0", got)
	}
	f.waitState(f.submit(`{"task": "demo.echo", "topic": "burn"}`), "done")

	f.restart(config(map[string]any{"paused": true, "enforce": true}))
	if !f.topicPaused("burn") {
		t.Fatal("enforce: true did not apply the config's pause")
	}
}

func TestTopicDiff(t *testing.T) {
	yes, no, zero, five := true, false, 0, 5
	stored := broker.TopicConfig{Name: "burn", DeadLetterEnabled: true}
	for _, c := range []struct {
		name  string
		patch broker.TopicPatch
		want  string
	}{
		{"nothing set changes nothing", broker.TopicPatch{}, ""},
		{"the same values change nothing", broker.TopicPatch{Paused: &no, ConcurrencyLimit: &zero, DeadLetterEnabled: &yes}, ""},
		{"each difference is named with both values", broker.TopicPatch{Paused: &yes, ConcurrencyLimit: &five},
			"concurrency_limit: stored 0, config 5; paused: stored false, config true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := topicDiff(stored, c.patch); got != c.want {
				t.Errorf("topicDiff = %q, want %q", got, c.want)
			}
		})
	}
}

// A concurrency_limit out of range is refused with a 400 naming the field
// and its range, before the broker is asked: the same bound as the config
// file's (broker.MaxConcurrencyLimit), never a broker failure (a 503 that
// tells the client to retry).
func TestSetTopicRefusesALimitOutOfRange(t *testing.T) {
	f := start(t, nil)
	for _, limit := range []string{"-1", "2147483648", "9223372036854775807"} {
		res := f.do("PUT", "/api/topics/default", `{"concurrency_limit": `+limit+`}`)
		if res.status != http.StatusBadRequest || !strings.Contains(string(res.body), "concurrency_limit must be from 0 (unlimited) to 2147483647") {
			t.Errorf("limit %s: %d %s, want 400 naming concurrency_limit and its range", limit, res.status, res.body)
		}
	}
	if res := f.do("PUT", "/api/topics/default", `{"concurrency_limit": 2147483647}`); res.status != http.StatusOK {
		t.Errorf("limit 2147483647: %d %s, want 200", res.status, res.body)
	}
	if _, err := ParseConfig(json.RawMessage(`{"topics": {"a": {"concurrency_limit": 2147483647}}}`)); err != nil {
		t.Errorf("the config refuses the largest limit the API takes: %v", err)
	}
}
