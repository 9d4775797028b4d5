package tasksworker

// Helpers of the UI tests: requests with the headers the host proxy sets,
// form tokens, redirects and flash messages.

import (
	"bytes"
	"context"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/capability"
)

// The UI is tested over the real gRPC HTTP capability, with the headers the
// host proxy sets.
const (
	uiTestHost   = "tw.test"
	uiTestPrefix = "/plugin-pkg/tasks_worker"
)

type uiResp struct {
	status int
	header http.Header
	body   string
}

// text is the body with HTML entities decoded, for assertions on messages.
func (r uiResp) text() string { return html.UnescapeString(r.body) }

// uiRequest sends a request as the host proxy would, with extra headers.
func (f *fixture) uiRequest(method, target string, form url.Values, hdr http.Header) uiResp {
	f.t.Helper()
	path, query, _ := strings.Cut(target, "?")
	h := http.Header{"X-Forwarded-Host": {uiTestHost}, "X-Forwarded-Prefix": {uiTestPrefix}, "X-Forwarded-For": {"127.0.0.1"}}
	var body []byte
	if form != nil {
		body = []byte(form.Encode())
		h.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		h[k] = v
	}
	var res uiResp
	var buf bytes.Buffer
	err := f.client.ProxyHTTP(context.Background(), capability.ProxyRequest{
		Method: method, Path: path, RawQuery: query, Body: body, Header: h, Actor: "local",
	}, func(status int, h http.Header) {
		res.status, res.header = status, h
	}, func(b []byte) error {
		buf.Write(b)
		return nil
	})
	if err != nil {
		f.t.Fatalf("%s %s: %v", method, target, err)
	}
	res.body = buf.String()
	return res
}

func (f *fixture) uiGet(target string) uiResp {
	f.t.Helper()
	return f.uiRequest("GET", target, nil, nil)
}

// uiToken reads a form token from a page, as a browser would.
func (f *fixture) uiToken() string {
	f.t.Helper()
	m := csrfField.FindStringSubmatch(f.uiGet("/ui/run").body)
	if m == nil {
		f.t.Fatal("the run page has no csrf_token field")
	}
	return html.UnescapeString(m[1])
}

// uiPost submits a form as a browser on the same host would.
func (f *fixture) uiPost(target string, form url.Values) uiResp {
	f.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	form.Set("csrf_token", f.uiToken())
	return f.uiRequest("POST", target, form, http.Header{"Origin": {"http://" + uiTestHost}})
}

// follow checks a POST's 303 and loads the page it redirects to.
func (f *fixture) follow(r uiResp) uiResp {
	f.t.Helper()
	if r.status != http.StatusSeeOther {
		f.t.Fatalf("status %d, want 303; body:\n%s", r.status, r.body)
	}
	loc := r.header.Get("Location")
	if !strings.HasPrefix(loc, uiTestPrefix+"/ui/") {
		f.t.Fatalf("redirect to %q, want a page under %s/ui/", loc, uiTestPrefix)
	}
	return f.uiGet(strings.TrimPrefix(loc, uiTestPrefix))
}

// flash returns the flash message of a page, or "".
func flashOf(r uiResp) string {
	m := regexp.MustCompile(`(?s)<div id="flash-message">(.*?)</div>`).FindStringSubmatch(r.body)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

func uiWait(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *fixture) apiJSON(target string) map[string]any {
	f.t.Helper()
	res := f.do("GET", target, "")
	if res.status != http.StatusOK {
		f.t.Fatalf("GET %s: %d %s", target, res.status, res.body)
	}
	return res.json(f.t)
}

func (f *fixture) topic(name string) map[string]any {
	f.t.Helper()
	for _, t := range f.apiJSON("/api/topics")["topics"].([]any) {
		if m := t.(map[string]any); m["name"] == name {
			return m
		}
	}
	f.t.Fatalf("no topic %q", name)
	return nil
}

func (f *fixture) locks() []any {
	f.t.Helper()
	return f.apiJSON("/api/locks")["locks"].([]any)
}

func mustContain(t *testing.T, page string, r uiResp, wants ...string) {
	t.Helper()
	body := r.text()
	for _, w := range wants {
		if !strings.Contains(body, w) {
			t.Errorf("%s lacks %q", page, w)
		}
	}
}
