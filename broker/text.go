package broker

import (
	"encoding/json"
	"errors"
	"strings"
	"unicode/utf8"
)

// CheckJSON checks that raw is JSON that every broker stores as it is:
// valid JSON in valid UTF-8, with no \u0000 escape (the NUL character) and
// no UTF-16 surrogate escape out of its pair. PostgreSQL's jsonb refuses
// both, so the memory and local brokers refuse them too. (It does not
// check numbers against jsonb's range, 1e1000000 say: PostgreSQL alone
// refuses those, as ErrInvalid.) The error says what is wrong, for the
// caller to wrap.
func CheckJSON(raw []byte) error {
	if !utf8.Valid(raw) {
		return errors.New("it is not valid UTF-8")
	}
	if !json.Valid(raw) {
		return errors.New("it is not valid JSON")
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
		if len(o.Result) == 0 {
			continue
		}
		if err := CheckJSON(o.Result); err != nil {
			return Invalid("result of outcome %d (message %d): %v", i, o.Claim.ID, err)
		}
	}
	return nil
}
