package host

// In-process tests of streamed uploads: the host's HTTP side with a
// plugin served in memory (capabilitytest) in place of a started binary.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

// uploadPlugin serves HTTP with a handler chosen by the test.
type uploadPlugin struct{ h http.HandlerFunc }

func (uploadPlugin) Describe(context.Context) (capability.Description, error) {
	return capability.Description{Name: "up", Version: "1"}, nil
}
func (uploadPlugin) Configure(context.Context, capability.ConfigureRequest) error { return nil }
func (uploadPlugin) CheckHealth(context.Context) (capability.Health, error) {
	return capability.Health{Status: capability.HealthOK}, nil
}
func (uploadPlugin) Stop(context.Context) error                         { return nil }
func (p uploadPlugin) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.h(w, r) }

const uploadConfig = "listen: 127.0.0.1:0\nadmin_token: " + testToken + "\nmax_body_bytes: 4096\nplugins:\n  up:\n    enabled: true\n"

// serveUpload serves config with plugin "up" running h in memory. With
// legacy, the plugin is taken for one built before body streaming: its
// capabilities lack http_body_stream, as an old binary's Describe does.
func serveUpload(t *testing.T, config string, legacy bool, h http.HandlerFunc) (*Server, string) {
	t.Helper()
	s, base := serve(t, config)
	c := capabilitytest.Connect(t, uploadPlugin{h: h})
	d, err := c.Describe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	caps := d.Capabilities
	if legacy {
		caps = []capability.Capability{capability.Lifecycles, capability.HTTP}
	}
	sup, ok := s.h.Plugin("up")
	if !ok {
		t.Fatal("no plugin up in the config")
	}
	sup.mu.Lock()
	sup.client, sup.st.State, sup.st.Capabilities = c, StateRunning, caps
	sup.mu.Unlock()
	return s, base
}

// ndjson is n lines of about 100 bytes.
func ndjson(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"task":"demo.echo","payload":{"i":%d,"pad":"%s"}}`+"\n", i, strings.Repeat("x", 60))
	}
	return b.String()
}

// seen is what the plugin's handler saw of one request.
type seen struct {
	lines         int
	bytes         int64
	contentLength int64
	header        http.Header
	err           error
}

// counter counts the body's lines and reports what it saw on ch.
func counter(ch chan<- seen) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sv := seen{contentLength: r.ContentLength, header: r.Header.Clone()}
		cr := &countingReader{r: r.Body}
		sc := bufio.NewScanner(cr)
		for sc.Scan() {
			sv.lines++
		}
		sv.bytes, sv.err = cr.n, sc.Err()
		ch <- sv
		if sv.err != nil {
			http.Error(w, sv.err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "lines=%d bytes=%d", sv.lines, sv.bytes)
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func upload(t *testing.T, base, contentType string, body io.Reader) answer {
	t.Helper()
	return do(t, &http.Client{Timeout: 2 * time.Minute}, "POST", base+"/plugin-pkg/up/upload", body,
		map[string]string{"Authorization": "Bearer " + testToken, "Content-Type": contentType})
}

func received(t *testing.T, ch <-chan seen) seen {
	t.Helper()
	select {
	case sv := <-ch:
		return sv
	case <-time.After(time.Minute):
		t.Fatal("the plugin's handler did not finish within a minute")
	}
	return seen{}
}

// An NDJSON upload passes max_body_bytes, streamed; the same body as JSON
// is refused as before; and the plugin still gets the host's headers.
func TestNDJSONUploadIsStreamed(t *testing.T) {
	ch := make(chan seen, 1)
	_, base := serveUpload(t, uploadConfig, false, counter(ch))
	body := ndjson(20000) // about 2 MB, 500 times max_body_bytes
	for _, ct := range []string{"application/x-ndjson", "Application/X-NDJSON; charset=utf-8"} {
		a := upload(t, base, ct, strings.NewReader(body))
		want := fmt.Sprintf("lines=20000 bytes=%d", len(body))
		if a.status != 200 || a.body != want {
			t.Fatalf("%s upload: %d %q, want 200 %q", ct, a.status, a.body, want)
		}
		sv := received(t, ch)
		if sv.contentLength != -1 {
			t.Errorf("%s: the plugin saw ContentLength %d, want -1 (streamed)", ct, sv.contentLength)
		}
		if sv.header.Get("Authorization") != "" || sv.header.Get("X-Taskhost-Actor") != "token" ||
			sv.header.Get("X-Forwarded-Prefix") != "/plugin-pkg/up" || sv.header.Get("X-Forwarded-For") != "127.0.0.1" {
			t.Errorf("%s: the plugin saw headers %v", ct, sv.header)
		}
	}
	a := upload(t, base, "application/json", strings.NewReader(body))
	if a.status != http.StatusRequestEntityTooLarge || !strings.Contains(a.body, "max_body_bytes") {
		t.Fatalf("JSON upload over max_body_bytes: %d %q, want 413", a.status, a.body)
	}
	// Without the token, nothing is streamed anywhere.
	a = do(t, nil, "POST", base+"/plugin-pkg/up/upload", strings.NewReader(body), map[string]string{"Content-Type": "application/x-ndjson"})
	if a.status != http.StatusUnauthorized {
		t.Fatalf("upload without a token: %d %q, want 401", a.status, a.body)
	}
}

// A plugin whose capabilities lack http_body_stream (one built before
// it) gets NDJSON bodies whole and bounded, as before.
func TestOldPluginGetsBufferedUploads(t *testing.T) {
	ch := make(chan seen, 1)
	_, base := serveUpload(t, uploadConfig, true, counter(ch))
	small := ndjson(10)
	a := upload(t, base, "application/x-ndjson", strings.NewReader(small))
	if a.status != 200 || a.body != fmt.Sprintf("lines=10 bytes=%d", len(small)) {
		t.Fatalf("small upload: %d %q", a.status, a.body)
	}
	if sv := received(t, ch); sv.contentLength != int64(len(small)) {
		t.Fatalf("the old plugin saw ContentLength %d, want %d (a whole body)", sv.contentLength, len(small))
	}
	a = upload(t, base, "application/x-ndjson", strings.NewReader(ndjson(1000)))
	if a.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("NDJSON over max_body_bytes to an old plugin: %d %q, want 413", a.status, a.body)
	}
}

// A client that goes away mid-upload leaves the plugin's handler with a
// read error, not a clean end of a shorter body.
func TestCutUploadIsAnErrorInThePlugin(t *testing.T) {
	ch := make(chan seen, 1)
	started := make(chan struct{})
	count := counter(ch)
	_, base := serveUpload(t, uploadConfig, false, func(w http.ResponseWriter, r *http.Request) {
		r.Body = &firstRead{ReadCloser: r.Body, started: started}
		count(w, r)
	})
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte(ndjson(500)))
		// Gone once the plugin has read a first piece.
		select {
		case <-started:
		case <-time.After(time.Minute):
		}
		pw.CloseWithError(errors.New("the client gives up"))
	}()
	req, err := http.NewRequest("POST", base+"/plugin-pkg/up/upload", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/x-ndjson")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	sv := received(t, ch)
	if sv.err == nil || !errors.Is(sv.err, io.ErrUnexpectedEOF) {
		t.Fatalf("the plugin read the cut upload as %v after %d lines; want an error wrapping io.ErrUnexpectedEOF", sv.err, sv.lines)
	}
}

// firstRead closes started at its first piece.
type firstRead struct {
	io.ReadCloser
	started chan struct{}
	once    sync.Once
}

func (f *firstRead) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	if n > 0 {
		f.once.Do(func() { close(f.started) })
	}
	return n, err
}

// The plugin's answer reaches the client while the client still sends
// the body (full duplex through the host).
func TestUploadAnswerIsFullDuplex(t *testing.T) {
	_, base := serveUpload(t, uploadConfig, false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		sc := bufio.NewScanner(r.Body)
		n := 0
		for sc.Scan() {
			n++
			fmt.Fprintf(w, "{\"got\":%q}\n", sc.Text())
			w.(http.Flusher).Flush()
		}
		fmt.Fprintf(w, "{\"done\":%d,\"error\":%q}\n", n, fmt.Sprint(sc.Err()))
	})
	pr, pw := io.Pipe()
	defer pw.Close()
	req, err := http.NewRequest("POST", base+"/plugin-pkg/up/upload", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/x-ndjson")
	type result struct {
		resp *http.Response
		err  error
	}
	res := make(chan result, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		res <- result{resp, err}
	}()
	if _, err := pw.Write([]byte("a\n")); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-res:
	case <-time.After(time.Minute):
		t.Fatal("no answer within a minute while the body is still open: not full duplex")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.resp.Body.Close()
	lines := bufio.NewReader(r.resp.Body)
	readLine := func(want string) {
		t.Helper()
		line, err := lines.ReadString('\n')
		if err != nil || line != want {
			t.Fatalf("answer line %q, %v; want %q", line, err, want)
		}
	}
	readLine("{\"got\":\"a\"}\n")
	if _, err := pw.Write([]byte("b\n")); err != nil {
		t.Fatal(err)
	}
	readLine("{\"got\":\"b\"}\n")
	_ = pw.Close()
	readLine("{\"done\":2,\"error\":\"<nil>\"}\n")
}

// The proxy timeout bounds inactivity on a streamed upload, not its
// length: a slow upload that keeps moving passes, even over several body
// timeouts and proxy timeouts; a plugin that goes quiet is cut with 504
// and an unknown outcome; a client that stops sending is cut at the body
// timeout.
func TestUploadTimeouts(t *testing.T) {
	config := strings.Replace(uploadConfig, "max_body_bytes", "body_timeout_seconds: 3\nmax_body_bytes", 1)
	var mu sync.Mutex
	mode := "count"
	ch := make(chan seen, 1)
	count := counter(ch)
	s, base := serveUpload(t, config, false, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		m := mode
		mu.Unlock()
		if m == "count" {
			count(w, r)
			return
		}
		// Quiet: read the body, then answer nothing until cut.
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	})
	s.proxyTimeout = 6 * time.Second

	// 32 lines, one every 250 ms: 8 s in all, over the body timeout (3 s)
	// and the proxy timeout (6 s). The timeouts leave wide margins for a
	// loaded machine: a line is late only after 3 s without one.
	pr, pw := io.Pipe()
	go func() {
		for i := range 32 {
			time.Sleep(250 * time.Millisecond) // a slow producer's pace
			if _, err := fmt.Fprintf(pw, "{\"i\":%d}\n", i); err != nil {
				return
			}
		}
		_ = pw.Close()
	}()
	a := upload(t, base, "application/x-ndjson", pr)
	if a.status != 200 || !strings.HasPrefix(a.body, "lines=32 ") {
		t.Fatalf("slow but steady upload: %d %q, want all 32 lines", a.status, a.body)
	}
	received(t, ch)

	// A client that sends one line and stops.
	pr, pw = io.Pipe()
	go func() { _, _ = pw.Write([]byte("{\"i\":0}\n")) }()
	defer pw.Close()
	a = upload(t, base, "application/x-ndjson", pr)
	if a.status != http.StatusRequestTimeout || !strings.Contains(a.body, "body_timeout_seconds") || a.header.Get("X-Taskhost-Outcome") != "unknown" {
		t.Fatalf("stalled client: %d %v %q, want 408 with an unknown outcome (the plugin got a part)", a.status, a.header, a.body)
	}
	if sv := received(t, ch); !errors.Is(sv.err, io.ErrUnexpectedEOF) {
		t.Fatalf("the plugin read a stalled upload as %v, want a cut body", sv.err)
	}

	mu.Lock()
	mode = "quiet"
	mu.Unlock()
	a = upload(t, base, "application/x-ndjson", strings.NewReader(ndjson(10)))
	if a.status != http.StatusGatewayTimeout || a.header.Get("X-Taskhost-Outcome") != "unknown" || !strings.Contains(a.body, "stalled") {
		t.Fatalf("quiet plugin: %d %v %q, want 504 with an unknown outcome", a.status, a.header, a.body)
	}
}
