package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// CheckJSON checks that raw is JSON that every broker stores as it is:
// valid JSON in valid UTF-8, with no \u0000 escape (the NUL character) and
// no UTF-16 surrogate escape out of its pair, nested at most MaxJSONDepth
// deep. PostgreSQL's jsonb refuses the first two, so the memory and local
// brokers refuse them too; the depth is this system's limit, which keeps
// the checks and the UI in linear memory. (It does not check numbers
// against jsonb's range, 1e1000000 say: PostgreSQL alone refuses those,
// as ErrInvalid.) The error says what is wrong, for the caller to wrap.
// It takes time linear in len(raw) and memory that grows with the depth
// alone.
func CheckJSON(raw []byte) error {
	if !utf8.Valid(raw) {
		return errors.New("it is not valid UTF-8")
	}
	if err := CheckJSONDepth(raw); err != nil {
		return err
	}
	// The JSON is valid: a backslash appears only inside strings, as an
	// escape.
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if raw[i] != 'u' {
			continue
		}
		r := hex4(raw[i+1 : i+5])
		i += 4
		switch {
		case r == 0:
			return errors.New(`it holds \u0000 (a NUL character), which PostgreSQL cannot store`)
		case r >= 0xDC00 && r <= 0xDFFF:
			return errors.New("it holds a UTF-16 low surrogate escape without its high half")
		case r >= 0xD800 && r <= 0xDBFF:
			if i+6 >= len(raw) || raw[i+1] != '\\' || raw[i+2] != 'u' {
				return errors.New("it holds a UTF-16 high surrogate escape without its low half")
			}
			if lo := hex4(raw[i+3 : i+7]); lo < 0xDC00 || lo > 0xDFFF {
				return errors.New("it holds a UTF-16 high surrogate escape without its low half")
			}
			i += 6
		}
	}
	return nil
}

// errNotJSON is CheckJSONDepth's answer to text that is not one JSON value.
var errNotJSON = errors.New("it is not valid JSON")

// CheckJSONDepth checks that raw is one JSON value (white space around it
// is fine) that nests arrays and objects at most MaxJSONDepth deep. It
// reads raw as a stream of tokens and stops at the first level too deep,
// so its memory grows with MaxJSONDepth, never with len(raw). It does not
// check UTF-8, escapes or duplicate names (CheckJSON checks the first
// two; duplicate names are JSON, which jsonb stores keeping the last).
func CheckJSONDepth(raw []byte) error {
	// Nothing nests deeper than its brackets' count: most JSON a task
	// carries has few, and is checked by encoding/json's scanner, which
	// allocates nothing. (Brackets inside strings count too; that only
	// sends more JSON down the token reader's path.)
	if opens := bytes.Count(raw, []byte{'{'}) + bytes.Count(raw, []byte{'['}); opens <= MaxJSONDepth {
		if !json.Valid(raw) {
			return errNotJSON
		}
		return nil
	}
	return checkDepthTokens(raw)
}

// checkDepthTokens is CheckJSONDepth's check of any JSON: a token reader
// that stops at the first level too deep.
func checkDepthTokens(raw []byte) error {
	d := depthDecoders.Get().(*jsontext.Decoder)
	defer depthDecoders.Put(d)
	d.Reset(bytes.NewReader(raw), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	defer d.Reset(bytes.NewReader(nil)) // do not keep raw alive in the pool
	for {
		if _, err := d.ReadToken(); err != nil {
			return errNotJSON
		}
		depth := d.StackDepth()
		if depth > MaxJSONDepth {
			return ErrTooDeep
		}
		if depth == 0 {
			break
		}
	}
	if _, err := d.ReadToken(); err != io.EOF {
		return errNotJSON
	}
	return nil
}

// depthDecoders keeps CheckJSONDepth's token readers: a new one costs
// more than a small document's check.
var depthDecoders = sync.Pool{New: func() any { return jsontext.NewDecoder(bytes.NewReader(nil)) }}

// ErrTooDeep is CheckJSONDepth's answer to JSON nested deeper than
// MaxJSONDepth: what is wrong and what to do, for the caller to wrap.
var ErrTooDeep = fmt.Errorf("it nests arrays and objects more than %d levels deep (the limit is %d): flatten it, or store the data elsewhere and pass a reference", MaxJSONDepth, MaxJSONDepth)

// hex4 decodes four hex digits (valid: the JSON was checked).
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// CleanText returns s with each NUL character and each invalid UTF-8
// sequence replaced by U+FFFD, so that every broker can store it. Error
// texts and log lines go through it: they are told, not refused.
func CleanText(s string) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// CheckOutcomes checks the results of an Ack call's outcomes (CheckJSON):
// one that cannot be stored makes the whole call ErrInvalid, naming it,
// before anything changes.
func CheckOutcomes(outcomes []Outcome) error {
	for i, o := range outcomes {
		if err := CheckOutcomeReport(o.Claim, o.Report); err != nil {
			return fmt.Errorf("outcome %d: %w", i, err)
		}
		if len(o.Result) == 0 {
			continue
		}
		if err := CheckJSON(o.Result); err != nil {
			return Invalid("result of outcome %d (message %d): %v", i, o.Claim.ID, err)
		}
	}
	return nil
}
