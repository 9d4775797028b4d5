package rabbitmq

import (
	"errors"
	"fmt"
	"regexp"

	amqp "github.com/rabbitmq/amqp091-go"
)

// This file owns what ties a prefix to one state store.
//
// A message's id names a row of the state store that made it, and means
// nothing in another: two state stores on one prefix (two hosts, each with
// its own local file, on one RabbitMQ) would take each other's deliveries,
// find no row, and drop them, and the tasks would stay queued in their
// own store for ever. So each state store has an identity (its id,
// sqlstore.Store.StoreID), and:
//
//   - at each connection, the broker declares the marker queue
//     <prefix>.store carrying its store's id. RabbitMQ refuses, atomically,
//     a declaration of an existing queue with other arguments, so the
//     first store on a prefix keeps it, and a broker of another store
//     fails to start (PrefixTakenError) instead of sharing it;
//   - every message it publishes carries the id in the header StoreHeader,
//     and a delivery stamped by another store is moved to its topic's
//     rejected queue, never taken and never dropped. That catches what
//     the marker cannot: a marker deleted while the other store still
//     runs, or the messages a replaced store left behind.
//
// RabbitMQ compares on a redeclaration only the arguments it knows, not
// one of ours: so the id goes in x-dead-letter-routing-key, an argument
// it knows that takes any string (the marker queue never dead-letters
// anything, since nothing is published to it), and in StoreHeader for a
// person reading the queue's arguments.

// StoreHeader is the header that carries, on every message the broker
// publishes, the id of the state store whose row the message points to.
const StoreHeader = "x-taskhost-store"

// store is the marker queue of the state store that uses the prefix.
func (n names) store() string { return n.prefix + ".store" }

// markerArgs are the arguments of the marker queue of store id.
func markerArgs(id string) amqp.Table {
	return amqp.Table{
		"x-queue-type":              "quorum",
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": id,
		StoreHeader:                 id,
	}
}

// ErrPrefixTaken is what Open returns (inside a *PrefixTakenError) when
// another state store uses the prefix on the virtual host.
var ErrPrefixTaken = errors.New("the amqp_prefix belongs to another state store")

// PrefixTakenError says which state store holds a prefix, and how to fix
// it.
type PrefixTakenError struct {
	Prefix, VHost string
	// Ours is this broker's store id, with where it is (Where); Theirs the
	// store id the marker queue carries ("" when RabbitMQ's reply did not
	// say: Reply has it).
	Ours, Where, Theirs string
	Reply               string
}

func (e *PrefixTakenError) Is(target error) bool { return target == ErrPrefixTaken }

func (e *PrefixTakenError) Error() string {
	marker := names{prefix: e.Prefix}.store()
	ours := "state store " + e.Ours
	if e.Where != "" {
		ours += " (" + e.Where + ")"
	}
	theirs, old := "state store "+e.Theirs, "store "+e.Theirs
	if e.Theirs == "" {
		theirs = fmt.Sprintf("another state store: its queue %s has other arguments than this store's (RabbitMQ: %s)", marker, e.Reply)
		old = "the other store"
	}
	return fmt.Sprintf("the prefix %q (amqp_prefix) on RabbitMQ virtual host %q belongs to %s, not to this host's %s. "+
		"A task's id names a row of the store that made it, so two state stores must not share a prefix: each would take "+
		"deliveries of the other's tasks, which it cannot run (two hosts with state_store: local have a store each; a store's id is in its table tw_store). "+
		"Fix: give each state store its own amqp_prefix, or let the hosts share one state store (state_store: postgres, with the same dsn and schema). "+
		"If %s is gone for good (a lost local file) and this one replaces it, delete the queue %s "+
		"(rabbitmqctl delete_queue --vhost %q %s), then restart: the messages %s left in the prefix's queues are then moved to their topics' .rejected queues",
		e.Prefix, e.VHost, theirs, ours, old, marker, e.VHost, marker, old)
}

// currentArg reads the store id a marker queue carries from RabbitMQ's
// reply to a declaration that differed in it: "inequivalent arg
// 'x-dead-letter-routing-key' for queue ...: received 'a' but current is
// 'b'" (or "... but current is the value 'b' of type 'longstr'").
var currentArg = regexp.MustCompile(`inequivalent arg 'x-dead-letter-routing-key' .* but current is (?:the value )?'([^']*)'`)

// claimPrefix declares the marker queue of this broker's store on ch:
// nil when the prefix is this store's (or was free and now is), a
// *PrefixTakenError when another store holds it. A refusal closes ch.
func (b *Broker) claimPrefix(ch *amqp.Channel) error {
	queue := b.names.store()
	_, err := ch.QueueDeclare(queue, true, false, false, false, markerArgs(b.storeID))
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		e := &PrefixTakenError{Prefix: b.opts.Prefix, VHost: vhostOf(b.opts.URL), Ours: b.storeID, Where: b.storeWhere, Reply: ae.Reason}
		if m := currentArg.FindStringSubmatch(ae.Reason); m != nil && m[1] != b.storeID {
			e.Theirs = m[1]
		}
		return e
	}
	if err != nil {
		return fmt.Errorf("declare queue %s: %w", queue, err)
	}
	b.remember(queue)
	return nil
}

// vhostOf returns the virtual host of an AMQP URL ("/" by default).
func vhostOf(u string) string {
	uri, err := amqp.ParseURI(u)
	if err != nil || uri.Vhost == "" {
		return "/"
	}
	return uri.Vhost
}

// storeWhere describes where a state store is, for a person: its file or
// its schema ("" when it says neither).
func storeWhere(s StateStore) string {
	switch s := s.(type) {
	case interface{ Path() string }:
		return "the local file " + s.Path()
	case interface{ Schema() string }:
		return "the postgres schema " + s.Schema()
	}
	return ""
}

// Why a delivery is moved to its topic's rejected queue: the values of
// Options.Rejected.
const (
	// RejectedNotATask: not one of the broker's messages (another type,
	// no message id).
	RejectedNotATask = "not_a_task"
	// RejectedOtherStore: a message of another state store (its
	// StoreHeader names another id).
	RejectedOtherStore = "other_store"
)

// otherStoreError: a delivery stamped by another state store.
type otherStoreError struct {
	id          int64
	theirs, our string
}

func (e *otherStoreError) Error() string {
	return fmt.Sprintf("a task of state store %s (its message id %d names a row of that store), not of this broker's store %s: "+
		"two state stores publish on this amqp_prefix; give each its own amqp_prefix", e.theirs, e.id, e.our)
}

// ours returns the message id a delivery carries and whether it is
// stamped with a store id, or why it is not one of this broker's messages
// (another type or no message id; another store's stamp, as an
// *otherStoreError). A delivery without a stamp (published by a version
// that did not stamp) is taken as this store's.
func (b *Broker) ours(d amqp.Delivery) (id int64, stamped bool, err error) {
	id, err = idOf(d)
	if err != nil {
		return 0, false, err
	}
	v, ok := d.Headers[StoreHeader]
	if !ok {
		return id, false, nil
	}
	if s, _ := v.(string); s != b.storeID {
		return 0, true, &otherStoreError{id: id, theirs: fmt.Sprint(v), our: b.storeID}
	}
	return id, true, nil
}
