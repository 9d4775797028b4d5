// Package testrabbit gives tests the RabbitMQ they run against: its URL
// (TASKHOST_TEST_AMQP_URL, by default the local node with the guest user)
// and fresh name prefixes on it.
//
// RabbitMQ being unreachable fails the test, never skips it: the failure
// says how to start it.
package testrabbit

import (
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Env names the variable that points the tests at another RabbitMQ.
const Env = "TASKHOST_TEST_AMQP_URL"

// DefaultURL is the RabbitMQ the tests use unless Env names another.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// HowToStart is what a test says when RabbitMQ does not answer.
const HowToStart = "start it with: rabbitmq-server -detached (or make test/setup), or set " + Env +
	" to a RabbitMQ the tests may declare queues on (default " + DefaultURL + ")"

// URL returns the test RabbitMQ's address (Env when set, else DefaultURL),
// after checking that it answers: when it does not, tb fails with
// HowToStart.
func URL(tb testing.TB) string {
	tb.Helper()
	u := DefaultURL
	if v := os.Getenv(Env); v != "" {
		u = v
	}
	c, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		tb.Fatalf("cannot reach the test RabbitMQ (%s): %v\n%s", redact(u), err, HowToStart)
	}
	_ = c.Close()
	return u
}

// Connect opens a connection to the test RabbitMQ, closed at cleanup.
func Connect(tb testing.TB) *amqp.Connection {
	tb.Helper()
	c, err := amqp.Dial(URL(tb))
	if err != nil {
		tb.Fatalf("connect to the test RabbitMQ: %v\n%s", err, HowToStart)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a fresh prefix of queue and exchange names, so that a
// test's names meet no other test's.
func Prefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "test" + hex.EncodeToString(b[:])
}

// Delete deletes queues and exchanges (those a test declared), so that
// the node does not accumulate them, reporting failures on tb.
func Delete(tb testing.TB, url string, queues, exchanges []string) {
	tb.Helper()
	if len(queues)+len(exchanges) == 0 {
		return
	}
	c, err := amqp.Dial(url)
	if err != nil {
		tb.Errorf("deleting the test's queues: %v", err)
		return
	}
	defer func() { _ = c.Close() }()
	ch, err := c.Channel()
	if err != nil {
		tb.Errorf("deleting the test's queues: %v", err)
		return
	}
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			tb.Errorf("deleting queue %s: %v", q, err)
			return
		}
	}
	for _, e := range exchanges {
		if err := ch.ExchangeDelete(e, false, false); err != nil {
			tb.Errorf("deleting exchange %s: %v", e, err)
			return
		}
	}
}

// redact describes u without its password.
func redact(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Redacted()
	}
	return "an unparsable " + Env
}
