package worker

import (
	"runtime/debug"
	"testing"
)

func TestTuneGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))

	t.Setenv("GOGC", "")
	if got := TuneGC(); got != GCPercent {
		t.Fatalf("TuneGC() without GOGC = %d, want %d", got, GCPercent)
	}
	if got := debug.SetGCPercent(100); got != GCPercent {
		t.Fatalf("the runtime's target is %d after TuneGC, want %d", got, GCPercent)
	}

	t.Setenv("GOGC", "150")
	if got := TuneGC(); got != 150 {
		t.Fatalf("TuneGC() with GOGC=150 = %d", got)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("TuneGC changed the target to %d although GOGC is set", got)
	}

	t.Setenv("GOGC", "off")
	if got := TuneGC(); got != -1 {
		t.Fatalf("TuneGC() with GOGC=off = %d, want -1", got)
	}
}
