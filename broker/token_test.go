package broker

import (
	"fmt"
	"testing"
	"time"
)

func TestReportKeysSortInTheOrderOfTheirClaims(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_000)
	a, b := ReportKey(at, "ffff"), ReportKey(at.Add(time.Millisecond), "0000")
	if want := "18bcfe56800-ffff"; a != "0"+want {
		t.Errorf("ReportKey = %q, want %q", a, "0"+want)
	}
	if !(a < b) {
		t.Errorf("the key of a later claim %q sorts before %q", b, a)
	}
	if ReportKey(at, "t1") == ReportKey(at, "t2") {
		t.Error("two claims made in the same millisecond share a key")
	}
}

func TestNewTokenIsRandom(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		tok := NewToken()
		if len(tok) != 32 || seen[tok] {
			t.Fatalf("token %q: %d digits or made twice", tok, len(tok))
		}
		seen[tok] = true
	}
}

// TestReportKeyFormat: the key is the claim's time in milliseconds as at
// least 12 hex digits, a dash and the token, for times before 1970, at
// 1970, now, and past the twelve digits.
func TestReportKeyFormat(t *testing.T) {
	for _, ms := range []int64{-1, -123456, 0, 1, 0xabc, 1_764_000_000_000, 1<<48 - 1, 1 << 48, 1<<62 + 5} {
		at := time.UnixMilli(ms).Add(999 * time.Microsecond)
		for _, tok := range []string{"", "6f1c0e4a-9d51-4b0e-8a39-2b5c4f3d2e10"} {
			if got, want := ReportKey(at, tok), fmt.Sprintf("%012x-%s", ms, tok); got != want {
				t.Errorf("ReportKey(%d ms, %q) = %q, want %q", ms, tok, got, want)
			}
		}
	}
}
