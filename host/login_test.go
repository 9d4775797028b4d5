package host

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The login form takes an urlencoded body only: any other is refused
// with 415 before it is read, and a wrong content type is no wrong token.
func TestLoginTakesOnlyURLEncodedForms(t *testing.T) {
	_, base := serve(t, "listen: 127.0.0.1:0\nadmin_token: "+testToken+"\nauth_max_failures: 2\n")
	form := url.Values{"token": {testToken}}.Encode()
	for _, tc := range []struct {
		name, contentType, body string
		status                  int
	}{
		{"multipart", "multipart/form-data; boundary=X", "--X\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\n" + testToken + "\r\n--X--\r\n", http.StatusUnsupportedMediaType},
		{"JSON", "application/json", `{"token": "` + testToken + `"}`, http.StatusUnsupportedMediaType},
		{"text", "text/plain", form, http.StatusUnsupportedMediaType},
		{"no content type", "", form, http.StatusUnsupportedMediaType},
		{"a form over 64 KiB", "application/x-www-form-urlencoded", form + "&next=" + strings.Repeat("x", 70<<10), http.StatusRequestEntityTooLarge},
		{"urlencoded with a charset", "application/x-www-form-urlencoded; charset=utf-8", form, http.StatusSeeOther},
		{"urlencoded", "application/x-www-form-urlencoded", form, http.StatusSeeOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := map[string]string{}
			if tc.contentType != "" {
				h["Content-Type"] = tc.contentType
			}
			a := do(t, nil, "POST", base+"/admin/login", strings.NewReader(tc.body), h)
			if a.status != tc.status {
				t.Fatalf("%d %s; want %d", a.status, a.body, tc.status)
			}
			if tc.status == http.StatusUnsupportedMediaType && !strings.Contains(a.body, "application/x-www-form-urlencoded") {
				t.Errorf("the refusal does not say what to send: %s", a.body)
			}
		})
	}
	// Six refusals, none counted as a wrong token (two would lock out).
	a := do(t, nil, "POST", base+"/admin/login", strings.NewReader(form), map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if a.status != http.StatusSeeOther {
		t.Errorf("login after the refused forms: %d; want 303 (refused forms are no wrong tokens)", a.status)
	}
}

// A multipart login with a file part larger than the in-memory part of a
// multipart form never lands in the temp directory: it is refused before
// a byte of it is read. (Before, the host parsed it and wrote the file
// part to $TMPDIR, removed only when the request ended: a body left
// hanging kept it there.)
func TestAMultipartLoginWritesNothingToTheTempDir(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	_, base := serve(t, "listen: 127.0.0.1:0\nadmin_token: "+testToken+"\nbody_timeout_seconds: 20\n")
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const fileSize = 40 << 20 // over the 32 MiB net/http keeps in memory
	head := "--X\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\nwrong\r\n" +
		"--X\r\nContent-Disposition: form-data; name=\"f\"; filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\n"
	fmt.Fprintf(c, "POST /admin/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=X\r\nContent-Length: %d\r\n\r\n%s",
		len(head)+fileSize+len("\r\n--X--\r\n"), head)
	// The file part, then nothing: the body stays unfinished.
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		chunk := make([]byte, 1<<20)
		for i := 0; i < fileSize/len(chunk); i++ {
			_ = c.SetWriteDeadline(time.Now().Add(15 * time.Second))
			if _, err := c.Write(chunk); err != nil {
				return // the host closed the connection: it read no more
			}
		}
	}()
	spilled := func() []string {
		entries, _ := os.ReadDir(tmp)
		var names []string
		for _, e := range entries {
			names = append(names, filepath.Join(tmp, e.Name()))
		}
		return names
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	answered := make(chan *http.Response, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			close(answered)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered <- resp
	}()
	// Watch the temp dir until the host answers, the upload is through,
	// or 30 s have passed.
	deadline := time.Now().Add(30 * time.Second)
	var resp *http.Response
	uploaded := (<-chan struct{})(sent)
	for resp == nil && time.Now().Before(deadline) {
		if names := spilled(); len(names) > 0 {
			t.Fatalf("the login wrote %v to the temp dir", names)
		}
		select {
		case resp = <-answered:
			if resp == nil {
				deadline = time.Now() // the connection ended without an answer
			}
		case <-uploaded:
			uploaded = nil // wait for the answer alone
		case <-time.After(20 * time.Millisecond):
		}
	}
	if names := spilled(); len(names) > 0 {
		t.Fatalf("the login wrote %v to the temp dir", names)
	}
	if resp == nil || resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("multipart login: %v; want 415", resp)
	}
}

// A login form that never arrives is answered 408 once
// body_timeout_seconds have passed, and is no wrong token: it neither
// counts against the address nor locks it out.
func TestALoginFormThatNeverArrivesIsNoWrongToken(t *testing.T) {
	s, base := serve(t, "listen: 127.0.0.1:0\nadmin_token: "+testToken+"\nbody_timeout_seconds: 1\nauth_max_failures: 1\n")
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "POST /admin/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ntoken=wrong")
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a login form that never arrives: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("status %d; want 408", resp.StatusCode)
	}
	if n := s.guard.failures.Load(); n != 0 {
		t.Errorf("%d wrong tokens counted; want none", n)
	}
	a := do(t, nil, "POST", base+"/admin/login", strings.NewReader(url.Values{"token": {testToken}}.Encode()),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if a.status != http.StatusSeeOther {
		t.Errorf("login with the right token after it: %d; want 303", a.status)
	}
}
