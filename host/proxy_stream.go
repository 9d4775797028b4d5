package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taskhost/taskhost/capability"
)

// streamedType is the one content type whose request bodies are streamed
// to a plugin: a body of lines the plugin can take one at a time, of any
// length.
const streamedType = "application/x-ndjson"

// streamsBody reports whether r's body is streamed to the plugin of status
// st instead of read whole: an NDJSON body (parameters such as charset
// aside) to a plugin that takes streamed bodies. An older plugin, which
// does not list capability.HTTPBodyStream, gets the body whole as before.
func streamsBody(r *http.Request, st Status) bool {
	if r.ContentLength == 0 && len(r.TransferEncoding) == 0 {
		return false
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == streamedType && st.Has(capability.HTTPBodyStream)
}

// errProxyIdle cancels a streamed request on which nothing moved for the
// proxy timeout.
var errProxyIdle = errors.New("no body piece and no answer for the proxy timeout")

// proxyStream forwards a request whose body goes to the plugin as it
// arrives, with no max_body_bytes: a million-line upload passes, and the
// plugin's answer reaches the client while the body is still being sent
// (full duplex). Each wait for more of the body is bounded by
// body_timeout_seconds. The proxy timeout bounds inactivity instead of the
// whole call, so a long upload that keeps moving is never cut: the call
// is cancelled when neither a piece of the body nor a piece of the answer
// passed for that long.
func (s *Server) proxyStream(w http.ResponseWriter, r *http.Request, name string, client *capability.Client, req capability.ProxyRequest) {
	rc := http.NewResponseController(w)
	// HTTP/1 needs it to let a handler write while it reads; HTTP/2 is
	// full duplex already and answers ErrNotSupported.
	_ = rc.EnableFullDuplex()
	wait := s.h.Config().BodyTimeout

	// Not r's context itself: net/http cancels it when a body read fails,
	// and the call must end by the body's error (so the plugin reads a cut
	// body, and the client gets its 408). Once the body has ended, a
	// client that goes away cancels the call.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	defer cancel(nil)
	idle := newIdleWatch(s.proxyTimeout, func() { cancel(errProxyIdle) })
	defer idle.stop()
	body := &streamedBody{r: r.Body, rc: rc, wait: wait, touch: idle.touch}
	defer context.AfterFunc(r.Context(), func() {
		if body.ended() {
			cancel(context.Canceled)
		}
	})()

	rel := newRelay(w, wait, idle.touch)
	defer rel.done()
	err := client.ProxyHTTPStream(ctx, req, body, rel.header, rel.body)
	idle.stop()
	if err == nil {
		return
	}
	var bodyErr *capability.RequestBodyError
	switch {
	case rel.wrote:
		s.log.Warn("proxied upload or its answer cut short", "plugin", name, "path", r.URL.Path, "error", err)
	case errors.As(err, &bodyErr):
		// Answered even when the request's context is done: a read
		// deadline passing cancels it too, and that client waits for its
		// 408. A client that went away reads nothing, at no cost. The
		// plugin got the upload's first part and may have acted on it.
		s.log.Warn("proxied upload cut short", "plugin", name, "path", r.URL.Path, "error", bodyErr.Err)
		w.Header().Set(outcomeHeader, "unknown")
		s.bodyFailed(w, bodyErr.Err, "no more of the streamed request body arrived",
			"; plugin "+strconv.Quote(name)+" got the part before and may have stored some of it: check before sending it again")
	case errors.Is(context.Cause(ctx), errProxyIdle):
		s.proxyFailed(w, r, name, fmt.Errorf("%w: %w", errProxyIdle, context.DeadlineExceeded))
	default:
		s.proxyFailed(w, r, name, err)
	}
}

// streamedBody is a request body read piece by piece for a plugin: each
// read may wait body_timeout_seconds (a read deadline set before it), and
// each piece counts as progress. Close ends a read in progress, once the
// plugin has answered without reading the rest.
type streamedBody struct {
	r     io.Reader
	rc    *http.ResponseController
	wait  time.Duration
	touch func()

	mu     sync.Mutex
	closed bool
	eof    bool
}

var errBodyClosed = errors.New("request body closed: the plugin answered without reading it all")

func (b *streamedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return 0, errBodyClosed
	}
	_ = b.rc.SetReadDeadline(time.Now().Add(b.wait))
	b.mu.Unlock()
	n, err := b.r.Read(p)
	if n > 0 {
		b.touch()
	}
	if err == io.EOF {
		// The server's deadlineBody has lifted the read deadline.
		b.mu.Lock()
		b.eof = true
		b.mu.Unlock()
	}
	return n, err
}

// ended reports whether the body was read to its end.
func (b *streamedBody) ended() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.eof
}

// Close makes a read in progress fail at once, by a read deadline in the
// past. The rest of the body is left unread: the server then closes the
// connection instead of reading an upload of any length to its end.
func (b *streamedBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.eof {
		return nil
	}
	b.closed = true
	_ = b.rc.SetReadDeadline(time.Now())
	return nil
}

// idleWatch calls fire once nothing touched it for timeout. Its goroutine
// ends with stop, which waits for it.
type idleWatch struct {
	last    atomic.Int64 // unix nanoseconds of the last touch
	quit    chan struct{}
	done    chan struct{}
	stopped sync.Once
}

func newIdleWatch(timeout time.Duration, fire func()) *idleWatch {
	iw := &idleWatch{quit: make(chan struct{}), done: make(chan struct{})}
	iw.touch()
	go func() {
		defer close(iw.done)
		t := time.NewTimer(timeout)
		defer t.Stop()
		for {
			select {
			case <-iw.quit:
				return
			case <-t.C:
			}
			idle := time.Since(time.Unix(0, iw.last.Load()))
			if idle >= timeout {
				fire()
				return
			}
			t.Reset(timeout - idle)
		}
	}()
	return iw
}

func (iw *idleWatch) touch() { iw.last.Store(time.Now().UnixNano()) }

func (iw *idleWatch) stop() {
	iw.stopped.Do(func() { close(iw.quit) })
	<-iw.done
}
