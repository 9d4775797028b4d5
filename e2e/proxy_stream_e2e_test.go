package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// ndjsonBody yields n NDJSON lines of about 110 bytes without holding
// them, filling each read.
type ndjsonBody struct {
	n, i  int
	cur   []byte
	bytes int64
}

func (b *ndjsonBody) Read(p []byte) (int, error) {
	total := 0
	for total < len(p) {
		if len(b.cur) == 0 {
			if b.i == b.n {
				break
			}
			b.cur = fmt.Appendf(b.cur[:0], `{"task":"demo.echo","payload":{"i":%d,"pad":"%s"}}`+"\n", b.i, strings.Repeat("x", 60))
			b.i++
		}
		n := copy(p[total:], b.cur)
		b.cur = b.cur[n:]
		total += n
	}
	b.bytes += int64(total)
	if total == 0 {
		return 0, io.EOF
	}
	return total, nil
}

// TestLargeNDJSONUploadThroughTheHost sends an NDJSON body thousands of
// times max_body_bytes through the real host to the example plugin's
// /count route, which reads it as a stream and answers its size; the same
// kind of body as JSON is refused with 413 as before.
func TestLargeNDJSONUploadThroughTheHost(t *testing.T) {
	h := startHost(t, `
listen: LISTEN
plugins_dir: PLUGINS
max_body_bytes: 4096
plugins:
  example:
    enabled: true
`)
	st := h.waitState(t, "example", "running", 30*time.Second)
	if !slices.Contains(st.Capabilities, "http_body_stream") {
		t.Fatalf("example's capabilities %v lack http_body_stream", st.Capabilities)
	}
	client := &http.Client{Timeout: 5 * time.Minute}
	post := func(contentType string, body io.Reader) (int, string) {
		t.Helper()
		req, err := http.NewRequest("POST", h.base+"/plugin-pkg/example/count", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	const lines = 300_000 // about 33 MB
	body := &ndjsonBody{n: lines}
	status, answer := post("application/x-ndjson", body)
	var got struct {
		Bytes int64 `json:"bytes"`
		Lines int64 `json:"lines"`
	}
	if status != 200 || json.Unmarshal([]byte(answer), &got) != nil {
		t.Fatalf("NDJSON upload: %d %q, want 200 with its size", status, answer)
	}
	if got.Lines != lines || got.Bytes != body.bytes {
		t.Fatalf("the plugin counted %d lines, %d bytes; sent %d lines, %d bytes", got.Lines, got.Bytes, lines, body.bytes)
	}

	status, answer = post("application/json", &ndjsonBody{n: 1000})
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(answer, "max_body_bytes") {
		t.Fatalf("JSON upload over max_body_bytes: %d %q, want 413", status, answer)
	}
}
