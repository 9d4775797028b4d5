package host

import (
	"crypto/sha256"
	"crypto/subtle"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// authGuard locks out a client address that sent too many wrong tokens:
// after max failures within window, every credential it sends (the right
// one too) is refused with 429 until window has passed since the last of
// them. Memory is bounded: at most guardMaxEntries addresses are
// remembered, and entries older than window are forgotten first (see
// prune).
type authGuard struct {
	max    int
	window time.Duration

	mu      sync.Mutex
	clients map[string]*guardEntry

	failures atomic.Int64 // wrong tokens
	refused  atomic.Int64 // credentials refused unchecked during a lockout
	lockouts atomic.Int64
}

type guardEntry struct {
	failures int
	first    time.Time // of the failures counted
	until    time.Time // locked out until
}

const guardMaxEntries = 10000

func newAuthGuard(max int, window time.Duration) *authGuard {
	return &authGuard{max: max, window: window, clients: map[string]*guardEntry{}}
}

// clientKey is the address a guard counts for: the peer's IP, an IPv6
// one by its /64 (one machine usually holds the whole /64).
func clientKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip.To4() != nil {
		return ip.To4().String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// locked returns how long client stays locked out; 0 if it is not.
func (g *authGuard) locked(client string, now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.clients[client]
	if e == nil || !now.Before(e.until) {
		return 0
	}
	g.refused.Add(1)
	return e.until.Sub(now)
}

// fail records a wrong token from client and returns how long it is now
// locked out (0 if not yet).
func (g *authGuard) fail(client string, now time.Time) time.Duration {
	g.failures.Add(1)
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.clients[client]
	if e == nil {
		if len(g.clients) >= guardMaxEntries {
			g.prune(now)
		}
		e = &guardEntry{first: now}
		g.clients[client] = e
	}
	if now.Sub(e.first) > g.window {
		e.failures, e.first = 0, now
	}
	e.failures++
	if e.failures >= g.max {
		e.until = now.Add(g.window)
		g.lockouts.Add(1)
		e.failures, e.first = 0, now
		return g.window
	}
	return 0
}

// succeed forgets client's failures (not a running lockout, which it
// cannot reach: a locked-out client's tokens are not checked).
func (g *authGuard) succeed(client string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.clients[client]; e != nil && !now.Before(e.until) {
		delete(g.clients, client)
	}
}

// prune drops stale entries and, if that leaves the table more than 7/8
// full, unlocked entries (in the map's random order) down to 7/8, running
// lockouts too if need be: an address flood costs a few forgotten
// counts, never unbounded memory; g.mu is held.
func (g *authGuard) prune(now time.Time) {
	for k, e := range g.clients {
		if !now.Before(e.until) && now.Sub(e.first) > g.window {
			delete(g.clients, k)
		}
	}
	target := guardMaxEntries - guardMaxEntries/8
	for _, evictLocked := range []bool{false, true} {
		for k, e := range g.clients {
			if len(g.clients) <= target {
				return
			}
			if evictLocked || !now.Before(e.until) {
				delete(g.clients, k)
			}
		}
	}
}

// equalSecret compares a presented secret with the expected one in a time
// that depends on neither: their SHA-256 digests are compared, so not even
// the length of the expected one shows.
func equalSecret(got, want string) bool {
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}
