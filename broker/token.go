package broker

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// NewToken returns a new random claim token (32 hex digits, 128 bits) for
// the stores that make their tokens in Go. Tokens are random on purpose:
// a store's running-messages index keyed by them takes each claim's entry
// at a random place, so btree cleans the dead entries of acked messages
// as it splits pages (see the postgres store's migration 007).
func NewToken() string {
	var buf [16]byte
	_, _ = rand.Read(buf[:]) // never fails (crypto/rand crashes instead)
	return hex.EncodeToString(buf[:])
}

// ReportKey returns the key of the reports of the attempt that ran under
// the claim with token, made at claimedAt: the claim's time in
// milliseconds (12 hex digits), a dash, then the token. It is unique to
// the attempt, so the report stored with its outcome and one stored again
// for the same attempt (its outcome's answer was lost) are one. Keys sort
// in the order of their claims, so a store's unique index of report keys
// takes new entries at its end, on the pages the reports before them just
// wrote, instead of dirtying a random page of a large index per report
// (which after every checkpoint also writes that page whole to the WAL).
func ReportKey(claimedAt time.Time, token string) string {
	ms := claimedAt.UnixMilli()
	if ms < 0 {
		return fmt.Sprintf("%012x-%s", ms, token)
	}
	// What the Sprintf above writes, in one allocation: each attempt
	// makes a key.
	var digits [16]byte
	hex := strconv.AppendInt(digits[:0], ms, 16)
	var b strings.Builder
	b.Grow(max(len(hex), 12) + 1 + len(token))
	for range 12 - len(hex) {
		b.WriteByte('0')
	}
	b.Write(hex)
	b.WriteByte('-')
	b.WriteString(token)
	return b.String()
}
