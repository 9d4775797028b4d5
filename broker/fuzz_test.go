package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// FuzzCheckJSON: CheckJSON accepts exactly the JSON that PostgreSQL's
// jsonb stores as it is, within MaxJSONDepth: valid UTF-8 and valid JSON
// (encoding/json agrees), nested at most MaxJSONDepth deep, with no
// \u0000 and no UTF-16 surrogate escape out of its pair (refJSON, a
// reference built on encoding/json). With TEST_DATABASE_URL set, jsonb
// itself is asked too.
func FuzzCheckJSON(f *testing.F) {
	for _, s := range []string{
		`{"a":1}`, `[]`, `"x"`, ` 1 `, `null`, `{"a":{"b":[1,2,{"c":null}]}}`, `{"a":1,"a":2}`,
		`"\u0000"`, `"\\u0000"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00"`, `"\ud83d\u0041"`, `"\uD83D\uDE00x"`,
		`"\ufffd"`, "\"\xef\xbf\xbd\"", "\"\xff\"", `{"a":`, `1 2`, `[1,]`, `1e400`, `-0.0e-0`, `"\/\b\f\n\r\t\""`,
		nested(MaxJSONDepth, `[`, ``, `]`), nested(MaxJSONDepth+1, `[`, ``, `]`), nested(MaxJSONDepth+1, `{"":`, `0`, `}`),
		nested(10001, `[`, ``, `]`),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		err := CheckJSON(raw)
		want, why := refJSON(raw)
		if (err == nil) != want {
			t.Fatalf("CheckJSON(%q) = %v, but the reference says %v (%s)", raw, err, want, why)
		}
		if err == nil {
			var v any
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.UseNumber()
			if uerr := dec.Decode(&v); uerr != nil {
				t.Fatalf("CheckJSON(%q) = nil, but encoding/json says %v", raw, uerr)
			}
		}
		if why == "depth" && len(raw) > 0 && utf8.Valid(raw) && json.Valid(raw) && !errors.Is(err, ErrTooDeep) {
			t.Fatalf("CheckJSON(%q) = %v, want ErrTooDeep", raw, err)
		}
		if why == "depth" || !utf8.Valid(raw) {
			return
		}
		if db := fuzzDB(t); db != nil {
			var out string
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			perr := db.QueryRow(ctx, `SELECT $1::text::jsonb::text`, string(raw)).Scan(&out)
			if ctx.Err() != nil {
				t.Logf("PostgreSQL took over 5s on %d bytes; not compared", len(raw))
				return
			}
			var pg *pgconn.PgError
			if errors.As(perr, &pg) && pg.Code == "22003" { // a number out of jsonb's range: not CheckJSON's to refuse
				return
			}
			if perr != nil && !errors.As(perr, &pg) {
				t.Fatalf("PostgreSQL: %v", perr)
			}
			if (err == nil) != (perr == nil) {
				t.Fatalf("CheckJSON(%q) = %v, but PostgreSQL's jsonb says %v", raw, err, perr)
			}
		}
	})
}

// refJSON says whether raw is JSON that CheckJSON must take, and if not,
// why: "utf8", "syntax", "depth", "nul" or "surrogate".
func refJSON(raw []byte) (bool, string) {
	switch {
	case !utf8.Valid(raw):
		return false, "utf8"
	case refDepth(raw) > MaxJSONDepth:
		return false, "depth"
	case !json.Valid(raw):
		return false, "syntax"
	}
	// Every string, keys too, as encoding/json decodes it: a NUL comes
	// only from \u0000 (JSON text holds no raw control character), and a
	// lone surrogate escape becomes U+FFFD, one more than the text holds.
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	decoded := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return false, "syntax"
		}
		if s, ok := tok.(string); ok {
			if strings.ContainsRune(s, 0) {
				return false, "nul"
			}
			decoded += strings.Count(s, "\uFFFD")
		}
	}
	if decoded != literalFFFD(raw) {
		return false, "surrogate"
	}
	return true, ""
}

// refDepth is how deeply raw nests arrays and objects, counting brackets
// outside strings (for any text, JSON or not).
func refDepth(raw []byte) int {
	depth, deepest := 0, 0
	inString, escaped := false, false
	for _, c := range raw {
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case inString && c == '"':
			inString = false
		case inString:
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}

// literalFFFD counts the U+FFFD characters valid JSON text raw holds:
// written out, or escaped as \ufffd.
func literalFFFD(raw []byte) int {
	n := bytes.Count(raw, []byte("\uFFFD"))
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if raw[i] == 'u' && strings.EqualFold(string(raw[i+1:i+5]), "fffd") {
			n++
		}
	}
	return n
}

var (
	fuzzDBOnce sync.Once
	fuzzDBConn *pgx.Conn
)

// fuzzDB is a connection to TEST_DATABASE_URL, or nil without one.
func fuzzDB(t *testing.T) *pgx.Conn {
	fuzzDBOnce.Do(func() {
		dsn := os.Getenv("TEST_DATABASE_URL")
		if dsn == "" {
			return
		}
		c, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			t.Logf("no PostgreSQL to compare with: %v", err)
			return
		}
		fuzzDBConn = c
	})
	return fuzzDBConn
}
