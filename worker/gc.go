package worker

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// GCPercent is the garbage collector's target (GOGC) a worker process runs
// with unless its environment sets GOGC.
//
// A worker's live heap is small (the messages in flight and the registry)
// while every message it runs leaves short-lived garbage; with Go's
// default of 100 the collector runs often under load and takes CPU the
// handlers and the database need. At 400 the heap grows to five times the
// live heap before a collection, which a small live heap affords.
const GCPercent = 400

// TuneGC sets the garbage collector's target to GCPercent unless the GOGC
// environment variable is set, and returns the target in force (-1 for
// off). The tasks_worker plugin calls it first thing; so does the bench.
func TuneGC() int {
	if v := strings.TrimSpace(os.Getenv("GOGC")); v != "" {
		if strings.EqualFold(v, "off") {
			return -1
		}
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
		return 100 // the runtime ignores a GOGC it cannot parse
	}
	debug.SetGCPercent(GCPercent)
	return GCPercent
}
