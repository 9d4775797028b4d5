package local

import (
	"context"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
)

// TestStoreIDIsTheFilesOwn: every process that opens one file reads one
// id, made once however many open the new file at once, and kept when it
// is opened again; another file has another.
func TestStoreIDIsTheFilesOwn(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "taskhost.db")
	ids := make([]string, 4)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			b, err := Open(ctx, Options{Path: path})
			if err != nil {
				t.Error(err)
				return
			}
			defer func() { _ = b.Close() }()
			if ids[i], err = b.StoreID(ctx); err != nil {
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
			t.Fatalf("opens of one new file at once read ids %v, want one", ids)
		}
	}
	again := openTest(t, Options{Path: path})
	if id, err := again.StoreID(ctx); err != nil || id != ids[0] {
		t.Fatalf("the file opened again: id %q, %v; want %q", id, err, ids[0])
	}
	other := openTest(t, Options{})
	if id, err := other.StoreID(ctx); err != nil || id == ids[0] {
		t.Fatalf("another file: id %q, %v; want another than %q", id, err, ids[0])
	}
}
