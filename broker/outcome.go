package broker

import "errors"

// ErrOutcomeUnknown: a write failed without its store saying how it ended.
// The connection to the database broke after the write was sent, so it may
// have committed although it failed: doing it again may do it twice (a
// submit stores a second task). Look before doing it again. A failed write
// without it did nothing.
var ErrOutcomeUnknown = errors.New("the outcome is unknown: the database's answer was lost")
