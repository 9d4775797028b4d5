package postgres

import (
	"strconv"
	"strings"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// This file owns the announcement of cancel requests: Cancel of a running
// message NOTIFYs the schema's cancel channel (CancelChannel) with the
// message id, in its transaction, so the worker pool of whichever process
// holds the claim learns of it when the request commits
// (broker.CancelNotifier); the broker's listener (listen.go) LISTENs to
// that channel beside the submit channel.

var (
	_ broker.CancelNotifier    = (*Broker)(nil)
	_ sqlstore.CancelAnnouncer = dialect{}
)

// CancelChannel is the name of the channel on which cancel requests of the
// running messages of schema ("" means "public") are announced: the
// payload is the message id, in decimal. It is "taskhost_cancel_" and the
// schema's name, shortened with a hash to PostgreSQL's 63 bytes. (Should
// it ever equal another schema's NotifyChannel, each reader ignores the
// other's payloads.)
func CancelChannel(schema string) string { return channelName("taskhost_cancel_", schema) }

// AnnounceCancel notifies the cancel channel of id within the transaction
// that requested the cancel: the notice goes out when it commits.
func (d dialect) AnnounceCancel(c sqlstore.Conn, id int64) error {
	_, err := c.Exec(`SELECT pg_notify($1, $2)`, d.b.listen.cancelChannel, strconv.FormatInt(id, 10))
	return err
}

// CancelNotices returns a channel that receives the ids of the messages
// whose cancel is requested, in any process using the broker's schema,
// from now on (see broker.CancelNotifier). It starts the listening
// connection if it is not running yet.
func (b *Broker) CancelNotices() <-chan int64 { return b.listen.cancelNotices() }

// cancelNotices registers a new reader of cancel notices.
func (l *listener) cancelNotices() <-chan int64 {
	c := make(chan int64, noticeBuffer)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return c // never fed: its reader polls
	}
	l.cancelSubs = append(l.cancelSubs, c)
	if !l.started {
		l.started = true
		go l.run()
	}
	return c
}

// cancelNotice hands the id a cancel notification's payload names to
// every reader that has room for it; a payload that is not an id is
// ignored.
func (l *listener) cancelNotice(payload string) {
	id, err := strconv.ParseInt(strings.TrimSpace(payload), 10, 64)
	if err != nil || id <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.cancelSubs {
		select {
		case c <- id:
		default:
		}
	}
}
