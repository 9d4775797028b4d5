package postgres

import (
	"context"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/internal/testdb"
)

// TestStoreIDIsTheSchemasOwn: every process that uses one schema reads
// one id, made once however many migrate the new schema at once, and kept
// when it is opened again; another schema has another.
func TestStoreIDIsTheSchemasOwn(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	schema := freshSchema(t)
	open := func() (string, error) {
		b, err := New(ctx, Options{DSN: testdb.DSN(), Schema: schema})
		if err != nil {
			return "", err
		}
		defer func() { _ = b.Close() }()
		return b.StoreID(ctx)
	}
	ids := make([]string, 4)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			var err error
			if ids[i], err = open(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(ids[0]) {
		t.Fatalf("store id %q, want 16 hex digits", ids[0])
	}
	for _, id := range ids[1:] {
		if id != ids[0] {
			t.Fatalf("opens of one new schema at once read ids %v, want one", ids)
		}
	}
	if id, err := open(); err != nil || id != ids[0] {
		t.Fatalf("the schema opened again: id %q, %v; want %q", id, err, ids[0])
	}
	other := newTestBroker(t, Options{})
	if id, err := other.StoreID(ctx); err != nil || id == ids[0] {
		t.Fatalf("another schema: id %q, %v; want another than %q", id, err, ids[0])
	}
}
