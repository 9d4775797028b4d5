package capability_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

// httpPlugin serves HTTP with a handler chosen by the test.
type httpPlugin struct {
	lifecycleOnly
	h http.HandlerFunc
}

func (p *httpPlugin) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.h(w, r) }

// lines yields n NDJSON lines without holding them, filling each read as
// a fast client's socket does, and hashes what it yields.
type lines struct {
	n, i int
	cur  []byte
	sum  hash.Hash
}

func newLines(n int) *lines { return &lines{n: n, sum: sha256.New()} }

func (l *lines) Read(p []byte) (int, error) {
	total := 0
	for total < len(p) {
		if len(l.cur) == 0 {
			if l.i == l.n {
				break
			}
			l.cur = fmt.Appendf(l.cur[:0], `{"task":"demo.echo","payload":{"i":%d,"pad":"%s"}}`+"\n", l.i, strings.Repeat("x", 100))
			l.i++
		}
		n := copy(p[total:], l.cur)
		l.sum.Write(l.cur[:n])
		l.cur = l.cur[n:]
		total += n
	}
	if total == 0 {
		return 0, io.EOF
	}
	return total, nil
}

// countHandler answers the size, line count and hash of the body it read,
// and the ContentLength it saw.
func countHandler(w http.ResponseWriter, r *http.Request) {
	sum := sha256.New()
	sc := bufio.NewScanner(io.TeeReader(r.Body, sum))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	n := 0
	for sc.Scan() {
		n++
	}
	if err := sc.Err(); err != nil {
		http.Error(w, "read: "+err.Error(), http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, "lines=%d sha256=%s content_length=%d", n, hex.EncodeToString(sum.Sum(nil)), r.ContentLength)
}

func proxyStream(t *testing.T, ctx context.Context, c *capability.Client, body io.Reader) (int, string, error) {
	t.Helper()
	var status int
	var out strings.Builder
	err := c.ProxyHTTPStream(ctx, capability.ProxyRequest{
		Method: "POST", Path: "/upload", Header: http.Header{"Content-Type": {"application/x-ndjson"}},
	}, body, func(s int, _ http.Header) { status = s }, func(b []byte) error {
		out.Write(b)
		return nil
	})
	return status, out.String(), err
}

// A streamed body far larger than the host's default max_body_bytes
// (8 MiB), and than one gRPC message may be (64 MiB), reaches the handler
// whole, as a stream of unknown length.
func TestStreamedBodyOfAnySize(t *testing.T) {
	c := capabilitytest.Connect(t, &httpPlugin{h: countHandler})
	d, err := c.Describe(context.Background())
	if err != nil || !d.Has(capability.HTTPBodyStream) {
		t.Fatalf("describe = %v, %v; want an HTTP plugin to list %s", d.Capabilities, err, capability.HTTPBodyStream)
	}
	const n = 600_000 // about 80 MiB
	body := newLines(n)
	status, out, err := proxyStream(t, context.Background(), c, body)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("lines=%d sha256=%s content_length=-1", n, hex.EncodeToString(body.sum.Sum(nil)))
	if status != 200 || out != want {
		t.Fatalf("answer %d %q, want 200 %q", status, out, want)
	}
}

// failingBody yields some lines, then, once the handler has read a
// first piece, fails as a client that went away.
type failingBody struct {
	lines   *lines
	left    int
	started <-chan struct{}
}

var errClientGone = errors.New("client went away")

func (b *failingBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		select {
		case <-b.started:
		case <-time.After(30 * time.Second):
		}
		return 0, errClientGone
	}
	n, err := b.lines.Read(p[:min(len(p), b.left)])
	b.left -= n
	return n, err
}

// A body cut short, by a failing read on the host side or by the call
// being cancelled, reads in the handler as an error, never as a clean
// end: a handler cannot take a cut upload for a whole one.
func TestCutBodyReadsAsAnError(t *testing.T) {
	readErr := make(chan error, 1)
	started := make(chan struct{}, 1) // the handler has read a first piece
	c := capabilitytest.Connect(t, &httpPlugin{h: func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 1024)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				select {
				case started <- struct{}{}:
				default:
				}
			}
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				readErr <- err
				return
			}
		}
	}})

	t.Run("body read fails", func(t *testing.T) {
		_, _, err := proxyStream(t, context.Background(), c, &failingBody{lines: newLines(1000), left: 100 << 10, started: started})
		var be *capability.RequestBodyError
		if !errors.As(err, &be) || !errors.Is(err, errClientGone) {
			t.Fatalf("proxy error = %v, want a RequestBodyError wrapping the read error", err)
		}
		checkCut(t, readErr)
	})

	t.Run("call cancelled", func(t *testing.T) {
		select { // a signal of the subtest before
		case <-started:
		default:
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		pr, pw := io.Pipe()
		go func() {
			// One line, then the caller gives up while the handler waits.
			_, _ = pw.Write([]byte(`{"task":"t"}` + "\n"))
			select {
			case <-started:
			case <-time.After(30 * time.Second):
			}
			cancel()
		}()
		_, _, err := proxyStream(t, ctx, c, pr)
		if err == nil {
			t.Fatal("a cancelled call answered no error")
		}
		checkCut(t, readErr)
	})
}

func checkCut(t *testing.T, readErr chan error) {
	t.Helper()
	select {
	case err := <-readErr:
		if err == nil || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("the handler read a cut body as %v; want an error wrapping io.ErrUnexpectedEOF", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not see the cut body within 30 s")
	}
}

// The handler writes an answer line while the body is still coming; the
// caller reads it before it sends the rest (full duplex).
func TestStreamIsFullDuplex(t *testing.T) {
	c := capabilitytest.Connect(t, &httpPlugin{h: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		sc := bufio.NewScanner(r.Body)
		n := 0
		for sc.Scan() {
			n++
			fmt.Fprintf(w, "got %s\n", sc.Text())
			w.(http.Flusher).Flush()
		}
		if sc.Err() != nil {
			fmt.Fprintf(w, "error %v\n", sc.Err())
			return
		}
		fmt.Fprintf(w, "done %d\n", n)
	}})
	pr, pw := io.Pipe()
	got := make(chan string, 10)
	var status int
	errc := make(chan error, 1)
	go func() {
		errc <- c.ProxyHTTPStream(context.Background(), capability.ProxyRequest{Method: "POST", Path: "/"}, pr,
			func(s int, _ http.Header) { status = s },
			func(b []byte) error { got <- string(b); return nil })
	}()
	wait := func(want string) {
		t.Helper()
		select {
		case s := <-got:
			if s != want {
				t.Fatalf("answer piece %q, want %q", s, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no answer piece %q within 30 s while the body is still open: not full duplex", want)
		}
	}
	for _, line := range []string{"one", "two"} {
		if _, err := pw.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		wait("got " + line + "\n")
	}
	_ = pw.Close()
	wait("done 2\n")
	if err := <-errc; err != nil || status != 200 {
		t.Fatalf("proxy = %d, %v", status, err)
	}
}

// A handler that answers without reading the body ends the call: the
// body, still open, is closed so that the caller does not wait for it.
func TestAnswerBeforeTheBodyEnds(t *testing.T) {
	c := capabilitytest.Connect(t, &httpPlugin{h: func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no thanks", http.StatusUnprocessableEntity)
	}})
	pr, _ := io.Pipe() // never written: only Close ends a read
	status, out, err := proxyStream(t, context.Background(), c, pr)
	if err != nil || status != http.StatusUnprocessableEntity || out != "no thanks\n" {
		t.Fatalf("answer %d %q %v, want 422 %q", status, out, err, "no thanks\n")
	}
	if _, err := pr.Read(make([]byte, 1)); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("read after the answer: %v, want the body closed", err)
	}
}

// A plugin built before body streaming lists no HTTPBodyStream (so the
// host sends it bodies whole, as before) and still serves them; the
// streaming call is unknown to it.
func TestOldPluginGetsWholeBodies(t *testing.T) {
	client, server := plugin.TestPluginGRPCConn(t, false, capability.LegacyPluginSet(&httpPlugin{h: countHandler}))
	t.Cleanup(func() {
		server.Stop()
		_ = client.Close()
	})
	c, err := capability.FromRPC(client)
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Describe(context.Background())
	if err != nil || !d.Has(capability.HTTP) || d.Has(capability.HTTPBodyStream) {
		t.Fatalf("describe = %v, %v; want http without %s", d.Capabilities, err, capability.HTTPBodyStream)
	}
	body := "{\"a\":1}\n{\"a\":2}\n"
	status, _, out, _ := proxy(t, c, capability.ProxyRequest{Method: "POST", Path: "/", Body: []byte(body)})
	sum := sha256.Sum256([]byte(body))
	want := fmt.Sprintf("lines=2 sha256=%s content_length=%d", hex.EncodeToString(sum[:]), len(body))
	if status != 200 || out != want {
		t.Fatalf("whole body: %d %q, want %q", status, out, want)
	}
	if _, _, err := proxyStream(t, context.Background(), c, strings.NewReader(body)); !errors.Is(err, capability.ErrUnimplemented) {
		t.Fatalf("streaming to an old plugin: %v, want ErrUnimplemented", err)
	}
}

// BenchmarkStreamedUpload measures a streamed NDJSON body through the
// in-process plugin connection (about 15 MB per op).
func BenchmarkStreamedUpload(b *testing.B) {
	c := capabilitytest.Connect(b, &httpPlugin{h: func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, n)
	}})
	size, _ := io.Copy(io.Discard, newLines(100_000))
	b.SetBytes(size)
	for b.Loop() {
		var out strings.Builder
		err := c.ProxyHTTPStream(context.Background(), capability.ProxyRequest{Method: "POST", Path: "/"}, newLines(100_000),
			func(int, http.Header) {}, func(p []byte) error { out.Write(p); return nil })
		if err != nil || out.String() != fmt.Sprint(size) {
			b.Fatalf("upload: %v, answer %q, want %d", err, out.String(), size)
		}
	}
}
