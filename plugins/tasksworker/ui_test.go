package tasksworker

import (
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/plugins/tasksworker/ui"
)

var csrfField = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

func TestUIPagesRender(t *testing.T) { flowUIPagesRender(t, nil) }

func flowUIPagesRender(t *testing.T, cfg map[string]any) {
	f := start(t, cfg)
	echo := f.submit(`{"task": "demo.echo", "payload": {"hello": "ui"}}`)
	fail := f.submit(`{"task": "demo.fail"}`)
	sleep := f.submit(`{"task": "demo.sleep", "payload": {"seconds": 30, "lock": "L1"}}`)
	nap := f.submit(`{"task": "demo.sleep", "payload": {"seconds": 0.01}}`)
	f.waitState(nap, "done")
	f.waitState(echo, "done")
	f.waitState(fail, "dead")
	f.waitState(sleep, "running")
	uiWait(t, settle, "the sleep holds its lock", func() bool { return len(f.locks()) == 1 })
	if res := f.do("POST", "/api/schedules", `{"name": "hourly", "task": "demo.echo", "interval_seconds": 3600}`); res.status != http.StatusCreated {
		t.Fatalf("create schedule: %d %s", res.status, res.body)
	}
	wid := f.apiJSON("/api/health")["worker_id"].(string)
	uiWait(t, settle, "this process leads the beat", func() bool {
		return f.apiJSON("/api/health")["beat"].(map[string]any)["leader"] == true
	})
	link := func(id string) string { return `href="` + uiTestPrefix + `/ui/tasks/` + id + `"` }

	cases := []struct {
		path  string
		wants []string
	}{
		{"/ui/", []string{"Task system", `id="topics"`, `id="workers"`, wid, "this process", "leader", `id="chart-depth"`,
			`id="chart-throughput"`, "<svg", "Reclaim orphaned messages now", `action="` + uiTestPrefix + `/ui/reclaim"`,
			`href="/admin/">Plugins</a>`}},
		{"/ui/tasks", []string{link(echo), link(fail), link(sleep), "demo.fail always fails", `name="state"`}},
		{"/ui/tasks?state=dead", []string{link(fail)}},
		{"/ui/tasks/" + echo, []string{"Task " + echo, `id="state">done`, `"hello": "ui"`, "success", "100%", "Run again"}},
		{"/ui/tasks/" + nap, []string{`class="logs">sleeping 0.01s`, "100%", `"slept_seconds": 0.01`}},
		{"/ui/tasks/" + fail, []string{`id="state">dead`, "demo.fail always fails", `id="requeue"`}},
		{"/ui/tasks/" + sleep, []string{`id="state">running`, `http-equiv="refresh"`, "L1"}},
		{"/ui/running", []string{link(sleep), "demo.sleep", wid, "Claim age"}},
		{"/ui/dead", []string{link(fail), "demo.fail always fails", `/ui/tasks/` + fail + `/requeue"`, "cannot be deleted"}},
		{"/ui/schedules", []string{"hourly", "every 1h0m0s", "enabled", `id="schedule-form"`, "Create schedule"}},
		{"/ui/schedules/hourly", []string{"Schedule hourly", "Save", `value="3600"`}},
		{"/ui/locks", []string{"L1", link(sleep), "Force release", `data-lock="L1"`}},
		{"/ui/topics", []string{`id="topic-default"`, "Set", "Pause", "Drain", "Purge", "also dead letters"}},
		{"/ui/run", []string{`<option value="demo.echo"`, `<option value="demo.sleep"`, "Payload (JSON)", "Registered tasks"}},
		{"/ui/run?from=" + echo, []string{`<option value="demo.echo" selected`, `"hello": "ui"`}},
	}
	for _, c := range cases {
		res := f.uiGet(c.path)
		if res.status != http.StatusOK {
			t.Errorf("GET %s: %d\n%s", c.path, res.status, res.body)
			continue
		}
		if ct := res.header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Errorf("GET %s: Content-Type %q", c.path, ct)
		}
		if res.header.Get("X-Frame-Options") != "DENY" || !strings.Contains(res.header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
			t.Errorf("GET %s: no framing protection: %v", c.path, res.header)
		}
		if strings.Contains(res.body, "ZgotmplZ") {
			t.Errorf("GET %s: a template value was refused by html/template (ZgotmplZ)", c.path)
		}
		mustContain(t, c.path, res, c.wants...)
	}
	if res := f.uiGet("/ui"); res.status != http.StatusOK || !strings.Contains(res.body, "Task system") {
		t.Errorf("GET /ui (no slash): %d", res.status)
	}
	if res := f.uiGet("/ui/tasks?state=dead"); strings.Contains(res.body, link(echo)) {
		t.Errorf("the state=dead filter lists the done task %s", echo)
	}

	for path, want := range map[string]string{
		"/ui/tasks/999999":           "There is no task 999999",
		"/ui/tasks/abc":              `"abc" is not a task id`,
		"/ui/schedules/nope":         `There is no schedule named "nope"`,
		"/ui/nowhere":                "There is no page at /ui/nowhere",
		"/ui/tasks?state=sleeping":   `There is no state "sleeping"`,
		"/ui/tasks?before=yesterday": `before="yesterday" is not a task id`,
	} {
		res := f.uiGet(path)
		if !strings.Contains(res.text(), want) || strings.Contains(res.body, "goroutine") {
			t.Errorf("GET %s: %d, want a page saying %q:\n%s", path, res.status, want, res.body)
		}
	}
	if res := f.uiGet("/ui/tasks/999999"); res.status != http.StatusNotFound {
		t.Errorf("unknown task: %d, want 404", res.status)
	}
}

func TestUITaskListPages(t *testing.T) { flowUITaskListPages(t, nil) }

func flowUITaskListPages(t *testing.T, cfg map[string]any) {
	f := start(t, cfg)
	var ids []string
	for range broker.DefaultListLimit + 3 {
		ids = append(ids, f.submit(`{"task": "demo.echo"}`))
	}
	first := f.uiGet("/ui/tasks?task=demo.echo")
	m := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(first.body)
	if m == nil {
		t.Fatalf("a full page has no link to older tasks:\n%s", first.body)
	}
	next := html.UnescapeString(m[1])
	if !strings.Contains(next, "before=") || !strings.Contains(next, "task=demo.echo") {
		t.Errorf("next link %q does not page with the filter", next)
	}
	second := f.uiGet(strings.TrimPrefix(next, uiTestPrefix))
	for _, id := range ids[:3] {
		if !strings.Contains(second.body, "/ui/tasks/"+id+`"`) {
			t.Errorf("the second page lacks task %s", id)
		}
	}
	if strings.Contains(second.body, "/ui/tasks/"+ids[len(ids)-1]+`"`) {
		t.Errorf("the second page repeats the newest task")
	}
	if !strings.Contains(second.body, "Newest") {
		t.Errorf("the second page has no way back to the newest")
	}
}

func TestUIRunForm(t *testing.T) { flowUIRunForm(t, nil) }

func flowUIRunForm(t *testing.T, cfg map[string]any) {
	f := start(t, cfg)
	res := f.uiPost("/ui/run", url.Values{"task": {"demo.echo"}, "payload": {`{"from": "the form"}`}})
	loc := res.header.Get("Location")
	page := f.follow(res)
	m := regexp.MustCompile(`/ui/tasks/(\d+)\?`).FindStringSubmatch(loc)
	if m == nil {
		t.Fatalf("the run form redirects to %q, want the new task's page", loc)
	}
	id := m[1]
	if got := flashOf(page); got != "Task "+id+" submitted (demo.echo)." {
		t.Errorf("flash %q", got)
	}
	got := f.waitState(id, "done")
	if !jsonEqual(t, got["result"], map[string]any{"from": "the form"}) {
		t.Errorf("result %v", got["result"])
	}
	mustContain(t, "the task page", f.uiGet("/ui/tasks/"+id), `id="state">done`, `"from": "the form"`)

	count := func() int { return len(f.apiJSON("/api/tasks?limit=1000")["tasks"].([]any)) }
	before := count()
	for _, c := range []struct {
		form   url.Values
		status int
		want   string
	}{
		{url.Values{"task": {"demo.echo"}, "payload": {"{\n  \"a\": 1,\n}"}}, 400, "The payload is not valid JSON (invalid character '}' looking for beginning of object key string, near line 3"},
		{url.Values{"task": {"demo.echo"}, "payload": {"{} {}"}}, 400, "The payload is not valid JSON"},
		{url.Values{"task": {"no.such"}}, 400, `unknown task "no.such"`},
		{url.Values{"task": {""}}, 400, "task is required"},
		{url.Values{"task": {"demo.echo"}, "topic": {"elsewhere"}}, 400, `topic "elsewhere" is not served by this worker`},
		{url.Values{"task": {"demo.echo"}, "delay_seconds": {"soon"}}, 400, `The delay must be a number of seconds, such as 30 or 0.5; "soon" is not.`},
		{url.Values{"task": {"demo.echo"}, "delay_seconds": {"-1"}}, 400, "delay_seconds must be from 0"},
		{url.Values{"task": {"demo.echo"}, "max_attempts": {"many"}}, 400, "Max attempts must be a whole number"},
		{url.Values{"task": {"demo.echo"}, "payload": {`"` + strings.Repeat("x", broker.MaxPayloadSize) + `"`}}, 400, "payload is"},
	} {
		res := f.uiPost("/ui/run", c.form)
		if res.status != c.status || !strings.Contains(flashOf(res), c.want) {
			t.Errorf("run %v: %d %q, want %d and a message with %q", c.form, res.status, flashOf(res), c.status, c.want)
		}
		if strings.Contains(res.body, "goroutine ") || strings.Contains(res.body, ".go:") {
			t.Errorf("run %v: the page shows a stack trace", c.form)
		}
	}
	// The form keeps what was typed.
	res = f.uiPost("/ui/run", url.Values{"task": {"demo.sleep"}, "payload": {`{"seconds": oops}`}})
	mustContain(t, "the refused form", res, `<option value="demo.sleep" selected`, `{"seconds": oops}`)
	if n := count(); n != before {
		t.Errorf("refused forms stored %d task(s)", n-before)
	}
}

func TestUIRequeue(t *testing.T) { flowUIRequeue(t, nil) }

func flowUIRequeue(t *testing.T, cfg map[string]any) {
	f := start(t, cfg)
	id := f.submit(`{"task": "demo.fail"}`)
	f.waitState(id, "dead")
	res := f.uiPost("/ui/tasks/"+id+"/requeue", url.Values{"back": {"/dead?topic=default"}})
	if loc := res.header.Get("Location"); !strings.HasPrefix(loc, uiTestPrefix+"/ui/dead?") || !strings.Contains(loc, "topic=default") {
		t.Errorf("requeue from the dead letters page goes to %q", loc)
	}
	if got := flashOf(f.follow(res)); got != "Task "+id+" is queued again." {
		t.Errorf("flash %q", got)
	}
	uiWait(t, settle, "the requeued task fails again", func() bool {
		m := f.apiJSON("/api/tasks/" + id)
		return m["state"] == "dead" && m["attempts"] == 2.0
	})

	done := f.submit(`{"task": "demo.echo"}`)
	f.waitState(done, "done")
	page := f.follow(f.uiPost("/ui/tasks/"+done+"/requeue", nil))
	if got := flashOf(page); !strings.Contains(got, "Could not requeue task "+done+": message "+done+" is done; only dead or failed messages can be requeued") {
		t.Errorf("requeue of a done task: flash %q", got)
	}
	// back must stay inside the UI.
	res = f.uiPost("/ui/tasks/"+id+"/requeue", url.Values{"back": {"//evil.example/x"}})
	if loc := res.header.Get("Location"); !strings.HasPrefix(loc, uiTestPrefix+"/ui/tasks/"+id+"?") {
		t.Errorf("back=//evil.example/x redirects to %q", loc)
	}
}

func TestUISchedules(t *testing.T) { flowUISchedules(t, nil) }

func flowUISchedules(t *testing.T, cfg map[string]any) {
	f := start(t, cfg)
	get := func(name string) response { return f.do("GET", "/api/schedules/"+name, "") }
	form := func(kv ...string) url.Values {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}

	page := f.follow(f.uiPost("/ui/schedules", form("name", "nightly", "task", "demo.echo", "payload", `{"n": 1}`,
		"cron", "0 3 * * *", "missed_policy", "fire_once", "enabled", "true")))
	if got := flashOf(page); got != "Schedule nightly created: cron 0 3 * * *, task demo.echo." {
		t.Errorf("flash %q", got)
	}
	mustContain(t, "the schedules page", page, `id="schedule-nightly"`, "cron 0 3 * * *", "runs once after downtime")
	res := get("nightly")
	if res.status != 200 {
		t.Fatalf("the created schedule is not in the API: %d %s", res.status, res.body)
	}
	s := res.json(t)["schedule"].(map[string]any)
	if s["task"] != "demo.echo" || s["cron"] != "0 3 * * *" || s["enabled"] != true || s["missed_policy"] != "fire_once" || !jsonEqual(t, s["payload"], map[string]any{"n": 1.0}) {
		t.Errorf("stored schedule %v", s)
	}

	for _, c := range []struct {
		form   url.Values
		status int
		want   string
	}{
		{form("name", "nightly", "task", "demo.echo", "interval_seconds", "60"), 409, `a schedule named "nightly" exists`},
		{form("name", "bad cron", "task", "demo.echo", "interval_seconds", "60"), 400, `name "bad cron": use letters, digits`},
		{form("name", "c", "task", "demo.echo", "cron", "61 * * * *"), 400, `cron "61 * * * *" is not valid`},
		{form("name", "c", "task", "demo.echo", "cron", "* * *"), 400, "it needs 5"},
		{form("name", "c", "task", "demo.echo", "interval_seconds", "60", "cron", "* * * * *"), 400, "give either interval_seconds or cron, not both"},
		{form("name", "c", "task", "demo.echo"), 400, "give interval_seconds"},
		{form("name", "c", "task", "demo.echo", "interval_seconds", "often"), 400, `the interval must be a whole number of seconds, such as 60; "often" is not`},
		{form("name", "c", "task", "demo nope", "interval_seconds", "60"), 400, `task "demo nope" can never run`},
		{form("name", "c", "task", "demo.echo", "interval_seconds", "60", "payload", "{oops"), 400, "The payload is not valid JSON"},
		{form("name", "c", "task", "demo.echo", "interval_seconds", "60", "missed_policy", "sometimes"), 400, `missed_policy "sometimes"`},
	} {
		res := f.uiPost("/ui/schedules", c.form)
		if res.status != c.status || !strings.Contains(flashOf(res), c.want) {
			t.Errorf("create %v: %d %q, want %d and %q", c.form, res.status, flashOf(res), c.status, c.want)
		}
		if c.form.Get("name") == "c" && !strings.Contains(res.body, `value="c"`) {
			t.Errorf("create %v: the refused form lost the name", c.form)
		}
	}
	if res := get("c"); res.status != http.StatusNotFound {
		t.Errorf("a refused schedule was stored: %d %s", res.status, res.body)
	}

	// Edit: from cron to an interval; the name in the form is ignored.
	page = f.follow(f.uiPost("/ui/schedules/nightly", form("name", "renamed", "task", "demo.echo", "interval_seconds", "90", "enabled", "true")))
	if got := flashOf(page); got != "Schedule nightly saved: every 1m30s." {
		t.Errorf("edit flash %q", got)
	}
	s = get("nightly").json(t)["schedule"].(map[string]any)
	if s["interval_seconds"] != 90.0 || s["cron"] != nil {
		t.Errorf("edited schedule %v", s)
	}
	if res := f.uiPost("/ui/schedules/nightly", form("task", "demo.echo", "cron", "bad")); res.status != 400 || !strings.Contains(flashOf(res), "Not saved:") {
		t.Errorf("bad edit: %d %q", res.status, flashOf(res))
	}
	if res := f.uiPost("/ui/schedules/ghost", form("task", "demo.echo", "interval_seconds", "5")); res.status != 404 {
		t.Errorf("edit of a missing schedule: %d", res.status)
	}

	// Toggle off and on.
	if got := flashOf(f.follow(f.uiPost("/ui/schedules/nightly/toggle", nil))); got != "Schedule nightly disabled." {
		t.Errorf("toggle flash %q", got)
	}
	if s := get("nightly").json(t)["schedule"].(map[string]any); s["enabled"] != false {
		t.Errorf("toggled schedule %v", s)
	}
	if got := flashOf(f.follow(f.uiPost("/ui/schedules/nightly/toggle", nil))); got != "Schedule nightly enabled." {
		t.Errorf("toggle flash %q", got)
	}
	if s := get("nightly").json(t)["schedule"].(map[string]any); s["enabled"] != true {
		t.Errorf("toggled schedule %v", s)
	}

	// Delete.
	if got := flashOf(f.follow(f.uiPost("/ui/schedules/nightly/delete", nil))); got != "Schedule nightly deleted." {
		t.Errorf("delete flash %q", got)
	}
	if res := get("nightly"); res.status != http.StatusNotFound {
		t.Errorf("deleted schedule: %d", res.status)
	}
	if got := flashOf(f.follow(f.uiPost("/ui/schedules/nightly/delete", nil))); !strings.Contains(got, "Could not delete schedule") {
		t.Errorf("second delete flash %q", got)
	}
}

func TestUIForceReleaseLock(t *testing.T) { flowUIForceReleaseLock(t, nil) }

func flowUIForceReleaseLock(t *testing.T, cfg map[string]any) {
	f := start(t, cfg)
	id := f.submit(`{"task": "demo.sleep", "payload": {"seconds": 30, "lock": "L"}}`)
	uiWait(t, settle, "the sleep holds lock L", func() bool { return len(f.locks()) == 1 })
	page := f.follow(f.uiPost("/ui/locks/release", url.Values{"name": {"L"}}))
	if got := flashOf(page); !strings.HasPrefix(got, "Lock L released.") {
		t.Errorf("flash %q", got)
	}
	if n := len(f.locks()); n != 0 {
		t.Errorf("%d lock(s) after the force release", n)
	}
	if strings.Contains(page.body, `data-lock="L"`) {
		t.Errorf("the locks page still lists L")
	}
	if got := flashOf(f.follow(f.uiPost("/ui/locks/release", url.Values{"name": {"L"}}))); got != "Lock L was not held (any more): nothing to release." {
		t.Errorf("second release flash %q", got)
	}
	if m := f.apiJSON("/api/tasks/" + id); m["state"] != "running" {
		t.Errorf("the task holding the lock is %v, want still running", m["state"])
	}
}

func TestUITopics(t *testing.T) { flowUITopics(t, nil) }

func flowUITopics(t *testing.T, cfg map[string]any) {
	f := start(t, cfg)
	dead := f.submit(`{"task": "demo.fail"}`)
	f.waitState(dead, "dead")

	post := func(op string, kv ...string) string {
		t.Helper()
		v := url.Values{"topic": {"default"}}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return flashOf(f.follow(f.uiPost("/ui/topics/"+op, v)))
	}
	if got := post("limit", "limit", "3"); got != "Topic default: at most 3 running at once." {
		t.Errorf("limit flash %q", got)
	}
	if tp := f.topic("default"); tp["concurrency_limit"] != 3.0 {
		t.Errorf("topic %v", tp)
	}
	for _, bad := range []string{"-2", "2147483648"} {
		if got := post("limit", "limit", bad); !strings.Contains(got, "must be a whole number from 0 (unlimited) to 2147483647") {
			t.Errorf("limit %s flash %q", bad, got)
		}
	}
	if got := post("pause", "paused", "true"); !strings.HasPrefix(got, "Topic default paused") || f.topic("default")["paused"] != true {
		t.Errorf("pause: %q %v", got, f.topic("default"))
	}
	if got := post("pause", "paused", "false"); !strings.HasPrefix(got, "Topic default resumed") || f.topic("default")["paused"] != false {
		t.Errorf("resume: %q %v", got, f.topic("default"))
	}
	if got := post("dead-letters", "enabled", "false"); !strings.Contains(got, "no dead letters") || f.topic("default")["dead_letter_enabled"] != false {
		t.Errorf("dead letters off: %q %v", got, f.topic("default"))
	}
	post("dead-letters", "enabled", "true")
	if got := post("drain"); !strings.HasPrefix(got, "Topic default is draining") || f.topic("default")["paused"] != true {
		t.Errorf("drain: %q %v", got, f.topic("default"))
	}
	// Queued while drained, then purged with the dead letters.
	f.submit(`{"task": "demo.echo"}`)
	f.submit(`{"task": "demo.echo"}`)
	if got := post("purge"); got != "Topic default purged: 2 queued task(s) deleted. Running tasks were left alone." {
		t.Errorf("purge flash %q", got)
	}
	if tp := f.topic("default"); tp["queued"] != 0.0 || tp["dead_letter"] != 1.0 {
		t.Errorf("after purge without dead letters: %v", tp)
	}
	f.submit(`{"task": "demo.echo"}`)
	if got := post("purge", "dead_letters", "true"); got != "Topic default purged: 1 queued task(s) deleted, and 1 dead letter(s). Running tasks were left alone." {
		t.Errorf("purge flash %q", got)
	}
	if tp := f.topic("default"); tp["queued"] != 0.0 || tp["dead_letter"] != 0.0 {
		t.Errorf("after purge with dead letters: %v", tp)
	}
	if res := f.uiPost("/ui/topics/explode", url.Values{"topic": {"default"}}); res.status != http.StatusNotFound {
		t.Errorf("unknown topic action: %d", res.status)
	}
	if got := flashOf(f.follow(f.uiPost("/ui/topics/pause", url.Values{"topic": {""}, "paused": {"true"}}))); !strings.Contains(got, "topic is empty") {
		t.Errorf("empty topic flash %q", got)
	}
}

func TestUIReclaim(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		f := start(t, nil)
		page := f.follow(f.uiPost("/ui/reclaim", nil))
		if got := flashOf(page); got != "Reclaim orphaned messages: the memory broker cannot orphan anything: its messages and locks die with the process" {
			t.Errorf("flash %q", got)
		}
	})
	t.Run("local", func(t *testing.T) {
		f := start(t, map[string]any{"broker": "local", "data_dir": t.TempDir()})
		page := f.follow(f.uiPost("/ui/reclaim", nil))
		if got := flashOf(page); got != "Reclaim orphaned messages: reclaimed 0, dead-lettered 0, released 0 lock(s)" {
			t.Errorf("flash %q", got)
		}
		mustContain(t, "the dashboard after reclaim", page, `"reclaimed": 0`, `class="flash ok"`)
	})
}

func TestUIRefusesFormsWithoutAValidToken(t *testing.T) {
	f := start(t, nil)
	f.waitState(f.submit(`{"task": "demo.echo"}`), "done") // the topic exists
	good := f.uiToken()
	other := ui.CSRFToken(time.Now())
	forged := other[:strings.LastIndex(other, ".")+1] + "AAAA" + other[strings.LastIndex(other, ".")+5:]
	origin := http.Header{"Origin": {"http://" + uiTestHost}}
	limit := func() any { return f.topic("default")["concurrency_limit"] }

	for _, c := range []struct {
		name  string
		token string
		hdr   http.Header
		want  string
	}{
		{"no token", "", origin, "it carries no security token"},
		{"malformed token", "abc", origin, "its security token is malformed"},
		{"forged mac", forged, origin, "its security token is not valid"},
		{"another secret", "1700000000.bm9uY2U." + strings.Repeat("A", 43), origin, "its security token is not valid"},
		{"expired token", ui.CSRFToken(time.Now().Add(-13 * time.Hour)), origin, "the page is older than 12h"},
		{"other origin", good, http.Header{"Origin": {"http://evil.example"}}, "it was sent from evil.example, not from tw.test"},
		{"null origin", good, http.Header{"Origin": {"null"}}, "opaque origin"},
		{"other referer", good, http.Header{"Referer": {"http://evil.example/page"}}, "it was sent from evil.example"},
		{"no origin nor referer", good, nil, "neither Origin nor Referer"},
	} {
		form := url.Values{"topic": {"default"}, "limit": {"7"}}
		if c.token != "" {
			form.Set("csrf_token", c.token)
		}
		res := f.uiRequest("POST", "/ui/topics/limit", form, c.hdr)
		if res.status != http.StatusForbidden || !strings.Contains(res.text(), c.want) {
			t.Errorf("%s: %d, want 403 saying %q:\n%s", c.name, res.status, c.want, res.body)
		}
		if got := limit(); got != 0.0 {
			t.Fatalf("%s: the refused form changed the limit to %v", c.name, got)
		}
	}
	// The same form with a good token from the same host goes through,
	// with either header.
	for _, hdr := range []http.Header{origin, {"Referer": {"http://" + uiTestHost + uiTestPrefix + "/ui/topics"}}} {
		res := f.uiRequest("POST", "/ui/topics/limit", url.Values{"topic": {"default"}, "limit": {"7"}, "csrf_token": {good}}, hdr)
		if res.status != http.StatusSeeOther || limit() != 7.0 {
			t.Errorf("good token with %v: %d, limit %v", hdr, res.status, limit())
		}
	}
	// Other methods are refused.
	if res := f.uiRequest("PUT", "/ui/topics/limit", url.Values{"csrf_token": {good}}, origin); res.status != http.StatusMethodNotAllowed {
		t.Errorf("PUT: %d", res.status)
	}
}

func TestUIFlashMessagesAreSigned(t *testing.T) {
	f := start(t, nil)
	res := f.uiGet("/ui/?flash=Your+data+was+deleted&fk=ok&fs=AAAA")
	if strings.Contains(res.body, "Your data was deleted") {
		t.Errorf("an unsigned flash message is shown")
	}
	q := url.Values{"flash": {"Signed <b>message</b>"}, "fk": {"error"}, "fs": {ui.SignFlash("error", "Signed <b>message</b>", "")}}
	res = f.uiGet("/ui/?" + q.Encode())
	if !strings.Contains(res.body, "Signed &lt;b&gt;message&lt;/b&gt;") || !strings.Contains(res.body, `class="flash error"`) {
		t.Errorf("a signed flash message is not shown, escaped:\n%s", res.body)
	}
}

func TestUINotRunning(t *testing.T) {
	p := New(nil)
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest("GET", "/ui/", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "tasks_worker is not running") {
		t.Errorf("before Configure: %d\n%s", rec.Code, rec.Body.String())
	}
}

// TestUIOnLocalAndPostgres runs the UI's page and form tests on the two
// stores a deployment uses (the tests above run on the memory broker).
func TestUIOnLocalAndPostgres(t *testing.T) {
	stores := map[string]func(t *testing.T) map[string]any{
		"local": func(t *testing.T) map[string]any {
			return map[string]any{"broker": "local", "data_dir": t.TempDir()}
		},
		"postgres": func(t *testing.T) map[string]any {
			return map[string]any{"broker": "postgres", "dsn": testdb.DSN(), "schema": freshSchema(t)}
		},
	}
	flows := map[string]func(*testing.T, map[string]any){
		"pages render": flowUIPagesRender, "task list": flowUITaskListPages, "run form": flowUIRunForm, "requeue": flowUIRequeue,
		"schedules": flowUISchedules, "force release": flowUIForceReleaseLock, "topics": flowUITopics,
	}
	for store, cfg := range stores {
		for name, flow := range flows {
			t.Run(store+"/"+name, func(t *testing.T) { flow(t, cfg(t)) })
		}
	}
}
