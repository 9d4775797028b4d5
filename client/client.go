package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// apiPrefix is where the host serves the tasks_worker plugin's API.
const apiPrefix = "/plugin-pkg/tasks_worker/api"

// Client talks to one running host over its HTTP API. It is safe for
// concurrent use; make one and share it.
type Client struct {
	base  string
	token string
	hc    *http.Client
	retry RetryPolicy
}

// Option changes how New makes a Client.
type Option func(*Client)

// WithToken sends the host's admin_token as "Authorization: Bearer
// <token>". A host that listens on a loopback address without an
// admin_token needs none; any other host refuses writes and admin calls
// without it.
func WithToken(token string) Option {
	return func(c *Client) { c.token = token }
}

// WithHTTPClient sends the requests with hc instead of a client of its
// own. Leave hc's Timeout at zero to use SubmitBatch on large uploads:
// the context of each call bounds it instead.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc = hc }
}

// WithRetry replaces DefaultRetry. RetryPolicy{} (or Attempts 1) turns
// the retries off.
func WithRetry(p RetryPolicy) Option {
	return func(c *Client) { c.retry = p }
}

// RetryPolicy says how often and how patiently a request that may be sent
// again is retried (see the package doc for which those are). The wait
// before try n+1 is a random duration up to MinDelay·2ⁿ⁻¹, capped at
// MaxDelay (full jitter, so that many clients do not retry in step),
// unless the answer had a Retry-After header: then that many seconds,
// capped at MaxDelay too. The context of the call bounds the whole.
type RetryPolicy struct {
	// Attempts is how many times a request is sent at most, the first
	// included; 0 or 1: once.
	Attempts int
	// MinDelay is the first wait's cap, MaxDelay every wait's.
	MinDelay, MaxDelay time.Duration
}

// DefaultRetry is the policy of a Client made without WithRetry: up to 5
// tries within about 10 seconds of waiting.
var DefaultRetry = RetryPolicy{Attempts: 5, MinDelay: 200 * time.Millisecond, MaxDelay: 5 * time.Second}

// New returns a client of the host at baseURL, such as
// "http://127.0.0.1:8080" (a bare host:port gets http://).
func New(baseURL string, opts ...Option) *Client {
	if !strings.Contains(baseURL, "://") {
		baseURL = "http://" + baseURL
	}
	c := &Client{base: strings.TrimRight(baseURL, "/"), retry: DefaultRetry}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		c.hc = &http.Client{}
	}
	return c
}

// BaseURL is the host's address as the client uses it.
func (c *Client) BaseURL() string { return c.base }

// request is one call: its method, path (under the host), query and JSON
// body, and whether it is idempotent enough to retry on a 503 or a
// connection that could not be made.
type request struct {
	method string
	path   string
	query  url.Values
	body   any  // encoded as JSON; nil: no body
	retry  bool // a non-safe request that may be retried (see the doc)
	admin  bool // an admin POST: needs a bearer header even without a token
}

// safe reports whether sending the request again can change nothing.
func (r request) safe() bool { return r.method == http.MethodGet || r.method == http.MethodHead }

// call sends r, retrying as the policy and the request allow, and decodes
// a 2xx JSON answer into out (when not nil).
func (c *Client) call(ctx context.Context, r request, out any) error {
	var body []byte
	if r.body != nil {
		var err error
		if body, err = json.Marshal(r.body); err != nil {
			return fmt.Errorf("%s %s: encode the request: %w", r.method, r.path, err)
		}
	}
	attempts := max(c.retry.Attempts, 1)
	if !r.safe() && !r.retry {
		attempts = 1
	}
	for try := 1; ; try++ {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		resp, err := c.send(ctx, r, rd, "application/json")
		if err == nil {
			err = readAnswer(resp, out)
		}
		wait, again := c.retryable(r, resp, err)
		if !again || try >= attempts || ctx.Err() != nil {
			return c.describe(r, err)
		}
		if err := sleep(ctx, c.backoff(try, wait)); err != nil {
			return c.describe(r, err)
		}
	}
}

// send makes and sends one HTTP request.
func (c *Client) send(ctx context.Context, r request, body io.Reader, contentType string) (*http.Response, error) {
	u := c.base + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	switch {
	case c.token != "":
		req.Header.Set("Authorization", "Bearer "+c.token)
	case r.admin:
		// A bearer header tells the host's admin endpoints that this is
		// not a browser form (no CSRF token to send); a host without an
		// admin_token ignores its value. Sent only here: a host that
		// wants a token counts a wrong one against this address.
		req.Header.Set("Authorization", "Bearer none")
	}
	return c.hc.Do(req)
}

// readAnswer reads resp to its end and closes it: a 2xx answer decoded
// into out, anything else returned as an *APIError.
func readAnswer(resp *http.Response, out any) error {
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if resp.StatusCode/100 != 2 {
		return apiError(resp, data)
	}
	if err != nil {
		return fmt.Errorf("read the answer: %w", err)
	}
	if out == nil {
		return nil
	}
	if raw, ok := out.(*json.RawMessage); ok {
		*raw = append((*raw)[:0], data...)
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("the host answered %d with a body that is not the expected JSON (%v): %.200s", resp.StatusCode, err, data)
	}
	return nil
}

// maxAnswer bounds an answer read whole: the largest is a list of 1,000
// tasks with their results.
const maxAnswer = 1 << 30

// retryable says whether a failed try may be sent again, and the wait the
// host asked for (Retry-After), if any.
func (c *Client) retryable(r request, resp *http.Response, err error) (time.Duration, bool) {
	if err == nil || errors.Is(err, ErrOutcomeUnknown) {
		return 0, false
	}
	var ae *APIError
	if errors.As(err, &ae) {
		switch {
		case ae.Status == http.StatusServiceUnavailable:
			return ae.RetryAfter, true
		case r.safe() && (ae.Status == http.StatusBadGateway || ae.Status == http.StatusGatewayTimeout):
			return ae.RetryAfter, true
		}
		return 0, false
	}
	if resp != nil {
		// The answer came and its body broke: a GET may be read again.
		return 0, r.safe()
	}
	return 0, r.safe() || notSent(err)
}

// notSent reports whether err says the request never reached the host:
// no connection could be made, so nothing can have been done.
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns) || errors.Is(err, syscall.ECONNREFUSED)
}

// backoff is the wait before try+1.
func (c *Client) backoff(try int, retryAfter time.Duration) time.Duration {
	lo, hi := c.retry.MinDelay, c.retry.MaxDelay
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi < lo {
		hi = lo
	}
	if retryAfter > 0 {
		return min(retryAfter, hi)
	}
	ceil := lo << min(try-1, 20)
	if ceil > hi || ceil <= 0 {
		ceil = hi
	}
	return time.Duration(rand.Int64N(int64(ceil)) + 1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// describe gives a failed call's error its context: an *APIError and
// ErrOutcomeUnknown as they are (their messages are the host's), a
// transport failure with what to check.
func (c *Client) describe(r request, err error) error {
	if err == nil {
		return nil
	}
	var ae *APIError
	if errors.As(err, &ae) || errors.Is(err, ErrOutcomeUnknown) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if !r.safe() {
			return fmt.Errorf("%s %s: %w: it may have been done (%w)", r.method, r.path, ErrOutcomeUnknown, err)
		}
		return fmt.Errorf("%s %s: %w", r.method, r.path, err)
	}
	if !r.safe() && !notSent(err) {
		return fmt.Errorf("%s %s: %w: the connection to %s broke (%w); it may have been done", r.method, r.path, ErrOutcomeUnknown, c.base, err)
	}
	return fmt.Errorf("cannot reach the host at %s (is it running? is the address right?): %w", c.base, err)
}

// retryAfter reads a Retry-After header given in seconds.
func retryAfter(h http.Header) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After")))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}
