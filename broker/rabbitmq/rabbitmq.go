package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// Defaults of Options.
const (
	DefaultURL       = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultPrefix    = "taskhost"
	DefaultHeartbeat = 5 * time.Second
)

// Options configure Open.
type Options struct {
	// URL is the RabbitMQ to connect to (DefaultURL when empty).
	URL string
	// State is where the state that RabbitMQ cannot hold lives: a
	// *local.Broker or a *postgres.Broker, opened by the caller. Close
	// closes it.
	State StateStore
	// Prefix starts the name of every queue and exchange (DefaultPrefix
	// when empty): brokers with different prefixes share nothing.
	Prefix string
	// Heartbeat is the AMQP heartbeat (DefaultHeartbeat when zero): a
	// process that stops answering for about twice this long loses its
	// connection, and its deliveries come back.
	Heartbeat time.Duration
	// DeliveryLimit is how many deliveries of one message RabbitMQ makes
	// before it dead-letters it (the setting orphan_max_attempts; the
	// topic queues' x-delivery-limit is one less, as RabbitMQ counts
	// returns): a message whose worker dies every time ends dead. Zero or
	// less means no limit. A queue declared before with another limit
	// keeps its own (a warning says so).
	DeliveryLimit int
	// MaxPayload is the largest payload Submit accepts, in bytes (the
	// state store checks it; zero means broker.MaxPayloadSize).
	MaxPayload int
	// Logger gets connection losses, reconnects and dropped deliveries.
	// Nil discards.
	Logger hclog.Logger
	// Rejected, when set, is called for each delivery moved to its
	// topic's rejected queue, with why (RejectedNotATask,
	// RejectedOtherStore): for a counter.
	Rejected func(reason string)
	// Republished, when set, is called with n queued messages the broker
	// published again because their topic queue had lost them (a purge,
	// a loss in RabbitMQ), with why (RepublishedMissing): for a counter.
	// See reconcile.go.
	Republished func(reason string, n int)

	// rebindEvery, for tests, replaces the package's rebindEvery; the
	// others replace reconcileEvery, reconcileIdle, the reconcile's hold
	// (a publish lease) and reconcileBatch.
	rebindEvery                                  time.Duration
	reconcileEvery, reconcileIdle, reconcileHold time.Duration
	reconcileBatch                               int
}

// StateStore is what the broker needs of its state store: a whole Broker
// (it answers everything that is not a message's travel), orphan reclaim,
// and the hooks of sqlstore.External.
type StateStore interface {
	broker.Broker
	broker.OrphanReclaimer
	sqlstore.External
}

// delegated is what Broker answers by its state store unchanged.
type delegated interface {
	broker.Broker
	LiveWorkers(ctx context.Context, after time.Duration) ([]string, error)
	ExpireWorker(ctx context.Context, workerID string) error
}

// Broker is the rabbitmq broker. Create it with Open.
type Broker struct {
	delegated

	state StateStore
	opts  Options
	log   hclog.Logger
	names names
	id    string // names this broker to the other processes (see notify.go)

	storeID    string     // the state store's id (see store.go)
	storeWhere string     // where the state store is, for a person
	stamp      amqp.Table // the headers of every message published: StoreHeader

	closed atomic.Bool
	ctx    context.Context // cancelled by Close
	stop   context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	sess   *session // nil while disconnected
	health error    // why sess is nil
	kick   chan struct{}

	held    heldDeliveries
	recon   *reconciler
	notices notices
	done    publishedEntries
	rr      atomic.Uint64 // rotates the first topic of claims
	queueMu sync.Mutex
	queues  map[string]bool // every queue this broker declared
	topics  map[string]bool // every topic whose queues it declared

	probeMu sync.Mutex
	probed  map[string]time.Time   // see probeDue
	limited map[string]*sync.Mutex // see Claim
	isLim   map[string]bool        // see isLimited
}

var (
	_ broker.Broker          = (*Broker)(nil)
	_ broker.OrphanReclaimer = (*Broker)(nil)
	_ broker.AckClaimer      = (*Broker)(nil)
)

// Open connects to RabbitMQ and starts the broker's loops: the outbox
// publisher, the dead-letter reader and the reconnect loop. It fails when
// RabbitMQ cannot be reached at first (later losses are reconnected), and
// when another state store uses the prefix on the virtual host
// (ErrPrefixTaken, in a *PrefixTakenError that says how to fix it).
func Open(ctx context.Context, o Options) (*Broker, error) {
	if o.State == nil {
		return nil, errors.New("rabbitmq broker: no state store (a local or postgres broker)")
	}
	if o.URL == "" {
		o.URL = DefaultURL
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.MaxPayload <= 0 {
		o.MaxPayload = broker.MaxPayloadSize
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.rebindEvery <= 0 {
		o.rebindEvery = rebindEvery
	}
	if o.Rejected == nil {
		o.Rejected = func(string) {}
	}
	if o.Republished == nil {
		o.Republished = func(string, int) {}
	}
	storeID, err := o.State.StoreID(ctx)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq broker: state store: reading its id: %w", err)
	}
	b := &Broker{
		delegated:  o.State,
		state:      o.State,
		opts:       o,
		log:        o.Logger,
		names:      names{prefix: o.Prefix},
		id:         brokerID(),
		storeID:    storeID,
		storeWhere: storeWhere(o.State),
		stamp:      amqp.Table{StoreHeader: storeID},
		kick:       make(chan struct{}, 1),
		queues:     make(map[string]bool),
		topics:     make(map[string]bool),
		probed:     make(map[string]time.Time),
		limited:    make(map[string]*sync.Mutex),
		isLim:      make(map[string]bool),
	}
	b.held.m = make(map[string]delivery)
	b.done.kick = make(chan struct{}, 1)
	b.recon = newReconciler(b)
	// The session claims the prefix for the store first: a store refused
	// is left as it was.
	s, err := b.dial(ctx)
	if err != nil {
		return nil, err
	}
	if e, ok := o.State.(interface{ EnableOutbox(context.Context) error }); ok {
		// Messages inserted into the store by others (client/pgtx) are
		// published too.
		if err := e.EnableOutbox(ctx); err != nil {
			s.close()
			return nil, fmt.Errorf("rabbitmq broker: state store: %w", err)
		}
	}
	b.sess = s
	b.ctx, b.stop = context.WithCancel(context.Background())
	b.wg.Add(5)
	go b.reconnectLoop(s)
	go b.publishLoop()
	go b.doneLoop()
	go b.deadLoop()
	go func() {
		defer b.wg.Done()
		b.recon.loop(b.ctx)
	}()
	return b, nil
}

// Missing is how many queued messages the topic queues lacked at this
// process's last look at each topic it uses, counted once a second look
// in a row finds the topic short (see reconcile.go): 0 while they hold
// what the state store has queued, more for a while after a purge, until
// the reconcile has published them again.
func (b *Broker) Missing() int { return b.recon.missing() }

// Kind returns "rabbitmq".
func (b *Broker) Kind() string { return "rabbitmq" }

// Health is nil while the broker is connected to RabbitMQ, and otherwise
// an error saying what is wrong (it reconnects meanwhile, with backoff).
func (b *Broker) Health() error {
	if b.closed.Load() {
		return broker.ErrClosed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sess == nil {
		return b.health
	}
	return nil
}

// Close stops the loops, closes the connection (RabbitMQ takes back every
// delivery still held) and closes the state store. Closing twice is
// allowed.
func (b *Broker) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.stop()
	b.mu.Lock()
	s := b.sess
	b.sess = nil
	b.health = broker.ErrClosed
	b.mu.Unlock()
	if s != nil {
		s.close()
	}
	b.wg.Wait()
	return b.state.Close()
}

// Queues returns the names of the queues this broker declared, so that a
// test can delete what it made.
func (b *Broker) Queues() []string {
	b.queueMu.Lock()
	defer b.queueMu.Unlock()
	out := make([]string, 0, len(b.queues))
	for q := range b.queues {
		out = append(out, q)
	}
	return out
}

// ErrUnavailable: the broker is not connected to RabbitMQ now; it is
// reconnecting (see Health).
var ErrUnavailable = errors.New("rabbitmq unavailable")

// current returns the connected session, or why there is none.
func (b *Broker) current() (*session, error) {
	if b.closed.Load() {
		return nil, broker.ErrClosed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sess == nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, b.health)
	}
	return b.sess, nil
}

// enter checks that the broker is open and ctx is live.
func (b *Broker) enter(ctx context.Context) error {
	if b.closed.Load() {
		return broker.ErrClosed
	}
	return ctx.Err()
}

// dial connects and opens the publishing channel.
func (b *Broker) dial(ctx context.Context) (*session, error) {
	b.mu.Lock()
	url := b.opts.URL
	b.mu.Unlock()
	c, err := amqp.DialConfig(url, amqp.Config{
		Heartbeat: b.opts.Heartbeat,
		Locale:    "en_US",
		Dial:      amqp.DefaultDial(10 * time.Second),
		Properties: amqp.Table{
			"connection_name": "taskhost " + b.opts.Prefix,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("rabbitmq broker: connect to %s: %w (is RabbitMQ running? start it with: rabbitmq-server -detached)", Redact(url), err)
	}
	s, err := newSession(b, c)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("rabbitmq broker: %w", err)
	}
	if err := ctx.Err(); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// reconnectLoop waits for the connection to close and connects again,
// with backoff, until the broker closes.
func (b *Broker) reconnectLoop(s *session) {
	defer b.wg.Done()
	for {
		closed := s.conn.NotifyClose(make(chan *amqp.Error, 1))
		select {
		case <-b.ctx.Done():
			return
		case e := <-closed:
			reason := "connection closed"
			if e != nil {
				reason = e.Error()
			}
			b.mu.Lock()
			if b.sess == s {
				b.sess = nil
				b.health = fmt.Errorf("lost the connection to RabbitMQ (%s); reconnecting", reason)
			}
			b.mu.Unlock()
			s.close()
			b.log.Warn("lost the connection to RabbitMQ; reconnecting", "reason", reason)
		}
		wait := 100 * time.Millisecond
		for {
			ns, err := b.dial(b.ctx)
			if err == nil {
				s = ns
				break
			}
			if b.ctx.Err() != nil {
				return
			}
			b.mu.Lock()
			b.health = fmt.Errorf("reconnecting to RabbitMQ: %v", err)
			b.mu.Unlock()
			if errors.Is(err, ErrPrefixTaken) {
				// Another store took the prefix while this one was away
				// (its marker queue was deleted): nothing of this store
				// is published or taken until it is fixed.
				b.log.Error("reconnect to RabbitMQ refused: another state store uses the prefix", "error", err, "retry_in", wait)
			} else {
				b.log.Warn("reconnect to RabbitMQ failed", "error", err, "retry_in", wait)
			}
			select {
			case <-b.ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(wait*2, 5*time.Second)
		}
		b.mu.Lock()
		if b.closed.Load() {
			b.mu.Unlock()
			s.close()
			return
		}
		b.sess, b.health = s, nil
		b.mu.Unlock()
		b.log.Info("reconnected to RabbitMQ")
		b.kickPublisher()
	}
}

// Exchanges returns the names of the exchanges this broker declares.
func (b *Broker) Exchanges() []string {
	return []string{b.names.deadExchange(), b.names.announceExchange()}
}

var (
	_ broker.FinishedPurger = (*Broker)(nil)
	_ broker.CancelNotifier = (*Broker)(nil)
)

// PurgeFinished deletes finished messages through the state store when it
// keeps them until told (postgres); a store that keeps a fixed number
// (local) has nothing to purge.
func (b *Broker) PurgeFinished(ctx context.Context, before time.Time) (int, error) {
	if err := b.enter(ctx); err != nil {
		return 0, err
	}
	if fp, ok := b.state.(broker.FinishedPurger); ok {
		return fp.PurgeFinished(ctx, before)
	}
	return 0, nil
}

// CancelNotices passes on the state store's announcements of cancel
// requests (postgres); with a store that has none (local) the channel
// never receives, and workers learn of requests at their CancelRequests
// poll.
func (b *Broker) CancelNotices() <-chan int64 {
	if cn, ok := b.state.(broker.CancelNotifier); ok {
		return cn.CancelNotices()
	}
	return make(chan int64)
}
