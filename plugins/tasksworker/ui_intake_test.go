package tasksworker

import (
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The run form takes a priority, a run-at time and a unique key; the task
// page shows them; a duplicate leads to the task that holds the key.
func TestUIRunFormIntake(t *testing.T) {
	f := start(t, nil)
	at := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	form := url.Values{"task": {"demo.echo"}, "priority": {"7"}, "run_at": {at}, "unique_key": {"ui-key"}}
	res := f.uiPost("/ui/run", form)
	m := regexp.MustCompile(`/ui/tasks/(\d+)\?`).FindStringSubmatch(res.header.Get("Location"))
	if m == nil {
		t.Fatalf("the run form redirects to %q, want the new task's page", res.header.Get("Location"))
	}
	id := m[1]
	mustContain(t, "the task page", f.uiGet("/ui/tasks/"+id), `id="priority">7`, `<code id="unique-key">ui-key</code>`, `id="state">queued`, "Runs from")
	mustContain(t, "the task list", f.uiGet("/ui/tasks"), `<td class="n">7</td>`)

	res = f.uiPost("/ui/run", url.Values{"task": {"demo.echo"}, "unique_key": {"ui-key"}})
	if loc := res.header.Get("Location"); !strings.Contains(loc, "/ui/tasks/"+id+"?") {
		t.Fatalf("a duplicate redirects to %q, want task %s", loc, id)
	}
	if got := flashOf(f.follow(res)); got != `Nothing submitted: task `+id+` holds the unique key "ui-key".` {
		t.Errorf("flash of a duplicate: %q", got)
	}

	count := func() int { return len(f.apiJSON("/api/tasks?limit=1000")["tasks"].([]any)) }
	before := count()
	for _, c := range []struct {
		form url.Values
		want string
	}{
		{url.Values{"task": {"demo.echo"}, "priority": {"high"}}, `The priority must be a whole number from -100 to 100; "high" is not.`},
		{url.Values{"task": {"demo.echo"}, "priority": {"500"}}, "priority is 500"},
		{url.Values{"task": {"demo.echo"}, "run_at": {"tomorrow"}}, `Run at must be an RFC 3339 time`},
		{url.Values{"task": {"demo.echo"}, "run_at": {at}, "delay_seconds": {"5"}}, "run_at and delay_seconds are both set"},
	} {
		res := f.uiPost("/ui/run", c.form)
		if res.status != 400 || !strings.Contains(flashOf(res), c.want) {
			t.Errorf("run %v: %d %q, want 400 and a message with %q", c.form, res.status, flashOf(res), c.want)
		}
	}
	if n := count(); n != before {
		t.Errorf("refused forms stored %d task(s)", n-before)
	}
}
