package broker

import (
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
