// Package rabbitmq is the rabbitmq broker: messages travel through
// RabbitMQ, and the state RabbitMQ cannot hold lives in a state store (a
// local or postgres broker, Options.State).
//
// # Where things live
//
// Each topic has a durable quorum queue, <prefix>.t.<topic>, whose
// x-delivery-limit is Options.DeliveryLimit (orphan_max_attempts) and
// whose dead letters go through the exchange <prefix>.dead into
// <prefix>.t.<topic>.dead. A message in RabbitMQ is a pointer: persistent,
// AMQP type "taskhost.message", its message id the id of its row in the
// state store, its header x-taskhost-store the id of that state store
// (StoreHeader). The row holds everything else (payload, state, attempts,
// claim token, unique key), so GET tasks/{id}, listings, unique keys,
// cancellation, requeue, reports, workers and their heartbeats, topic
// settings, schedules, locks and leases are the state store's, shared by
// every process that uses it.
//
// # The row is the fence
//
// Submit stores the row and its outbox entry in one transaction of the
// state store, then publishes and waits for RabbitMQ's publisher confirm.
// The outbox entry is due a lease ahead: when the process dies before the
// confirm, or RabbitMQ is down, the publisher loop of any process
// publishes the message once the lease has passed (a delayed message's
// entry is due when it becomes available). A duplicate in RabbitMQ is
// harmless, because a delivery runs only once its row is taken.
//
// Claim takes deliveries (manual ack) round-robin over the topics asked
// for, by basic.get, or as a batch through a short-lived consumer when a
// get says more are ready (fetch.go), and makes their rows running with
// fresh tokens in the state store, in one transaction (sqlstore.Take
// states the rule): a queued row
// is taken when its topic is neither paused nor at its limit; a running
// row only by a redelivery, that is after its holder's channel closed;
// a delivery whose row ended or is held (a duplicate) is acked and
// dropped, and so is one whose row is gone (cleared after its task
// ended, or purged), which a delivery stamped by this store can only be.
// A delivery stamped by another store never gets that far (see One state
// store per prefix).
// The delivery stays unacked while its message runs. Ack, Nack and
// DeadLetter write the outcome through the state store's own
// token-checked methods first, then ack the delivery: a frozen worker's
// late ack, after its delivery came back and was taken again, fails the
// token check and is broker.ErrClaimLost.
//
// A requeue (Nack with Requeue, Requeue, a reclaim) publishes the message
// again as a new one (its outbox entry written before the state changes);
// RabbitMQ's own requeue is never used for messages, so only deliveries
// lost with a dead worker count toward the delivery limit.
//
// # Dead workers
//
// A dead or frozen worker's deliveries come back by RabbitMQ's own
// means: its connection closes, or misses its AMQP heartbeats
// (Options.Heartbeat). The next take of each makes its row running under
// a new claim, marked Suspect with an "orphaned:" last error, and
// releases the locks of the old claim. After DeliveryLimit deliveries
// RabbitMQ dead-letters the message, and the broker ends its row dead
// (the dead queue is read every second). ReclaimOrphans, the reaper's
// pass, does not reclaim what RabbitMQ brings back, and reports it: see
// its documentation.
//
// One weakness is known: a copy of a running message's pointer (a
// duplicate publish) that is itself redelivered, because the claimer that
// was dropping it lost its connection in that instant, takes the message
// from its live holder, whose ack is then refused as lost; the message
// runs twice, as at-least-once allows.
//
// # Concurrency limits
//
// A topic's limit is the count of its running rows, as the broker
// contract says, checked in the transaction of the take (race-free across
// processes: the state store serialises the takes of a limited topic).
// A dead worker's slot passes to the claim that takes its redelivered
// message, or frees when RabbitMQ dead-letters it. Changing the limit
// takes effect at the next take and never lets more run than the new
// limit admits: there are no tokens to re-seed. A limited topic's claims
// ask RabbitMQ for no more deliveries than the limit admits; a take that
// loses a race for the last slot publishes the message again at the end
// of the queue (as a new message, so waiting costs no delivery). A topic
// at its limit is still looked at once a second by each process, since
// the delivery that passes a dead worker's slot on is back at the head of
// its queue (see probeDue).
//
// Token queues (a queue of N tokens per limited topic, held unacked while
// a message runs) were the other design. They are not used: the count
// would then live in two places (tokens, and the running rows that Stats,
// the API and the reaper read), re-seeding on a limit change needs
// generations to never exceed the limit, and a dead worker's token would
// come back before its message's slot is passed on, so for a while both
// its redelivered message and a new one could run.
//
// # Locks
//
// Locks are the state store's (AcquireLock, ReleaseLock, Locks), held
// under a claim: they are released when the claim ends, and a claim ends
// when its outcome is stored, when RabbitMQ's redelivery of its message
// is taken again (its holder's connection died: the lock's TTL is the
// AMQP heartbeat), or when RabbitMQ dead-letters the message. A dead
// holder's lock is also released by the reaper's pass (the locks of
// non-live holders past the grace), so it is freed even when its message
// is not taken again, as on the local and postgres brokers.
//
// # Messages from elsewhere
//
// rabbitmq.Open installs triggers in the state store (both kinds) that
// give an outbox entry to every message that becomes queued, in the
// transaction that makes it so: one inserted by something else
// (client/pgtx's transactional enqueue) or by a schedule's fire, due a
// few seconds after it is available, and one put back by a requeue or
// the reaper's reclaim, due a publish lease after. So a process that dies
// between such a commit and its publish loses no message: the publisher
// loop of any process publishes it. A topic queue found empty at its
// first declaration in a process is looked at by the reconcile at once
// (see Faults), in case its messages were lost while no broker ran.
//
// # Announcements
//
// A message published, once RabbitMQ confirmed it, is announced to the
// pools of the publishing process, and through the fanout exchange
// <prefix>.announce to those of the other processes (notify.go). The
// pools poll as well: announcements can be lost, and RabbitMQ's
// redeliveries are not announced.
//
// # One state store per prefix
//
// A message's id names a row of the state store that made it, and means
// nothing in another, where the same id may be another task. So a prefix
// belongs to one state store (every process that uses the store, on any
// host, shares it): each store has an id, made once by its migration
// (sqlstore.Store.StoreID), and the broker
//
//   - declares, at each connection, the durable marker queue
//     <prefix>.store whose arguments carry its store's id. RabbitMQ
//     refuses a declaration of an existing queue with other arguments, in
//     one step, so the first store keeps the prefix and Open of another
//     fails with a *PrefixTakenError (ErrPrefixTaken) naming both stores,
//     the prefix and the fix: a distinct amqp_prefix per state store, or
//     one shared state store (postgres). A store that replaces a lost one
//     takes the prefix once an operator deletes <prefix>.store (store.go);
//   - stamps its id on every message it publishes, and moves a delivery
//     stamped by another store to its topic's rejected queue (below),
//     counted and logged as an error, instead of taking or dropping it:
//     it is that store's task, which waits in that store. This covers what
//     the marker cannot: a marker deleted while its store still runs, and
//     the messages a replaced store left in the queues.
//
// A delivery without the stamp (published by a version before it) is
// taken as this store's, as before; should its row be gone, its drop is
// logged at WARN, since it may have been another store's.
//
// # Not ours
//
// A delivery on a topic queue or a dead queue that is not one of this
// broker's messages (another type, no message id, another store's stamp)
// is moved to <prefix>.t.<topic>.rejected with the reason in the header
// x-taskhost-reason (its own headers, the stamp too, are kept) and
// counted (Options.Rejected); it never runs and ends no row. It is acked
// only once RabbitMQ has confirmed its copy.
//
// # Faults
//
// Health is nil while connected. After a connection loss the broker
// reconnects with backoff (channels and declarations are made again on
// first use) and Health says what is wrong meanwhile; claims fail, and
// submits are stored and published once RabbitMQ is back. A topic queue
// deleted by an operator is declared again at the next claim or publish
// that meets its absence, and the topic's queued messages are published
// again. A reconnect that finds the prefix taken by another store (its
// marker queue was deleted meanwhile) is refused like a start: the broker
// stays disconnected, Health says why, and it tries again with backoff.
//
// A topic queue that lost messages but not itself (purged by an operator,
// rabbitmqctl purge_queue; messages lost by RabbitMQ) is found by the
// reconcile (reconcile.go): each process compares the ready count of each
// topic queue it uses with the topic's rows that RabbitMQ should hold
// (queued, available, published and confirmed), every 30 seconds and
// within seconds of its claims finding the queue empty after deliveries,
// reading at most as many rows as the queue holds and 5,000 more. A topic
// short at every look for a publish lease has its missing rows, the
// oldest first and up to 5,000 a look, put in the outbox again by the one
// process that holds the topic's reconcile lease in the state store;
// Options.Republished counts them, a WARN names the topic and the counts,
// and Missing says how many the last looks found missing. What the count
// cannot see (deliveries on their way to a take, publishes being
// confirmed, delayed messages, running ones) is told apart by the settle
// between the count and the rows, by the outbox entries, and by the hold:
// a healthy topic has nothing republished. A republished row that was in
// the queue after all is a duplicate, which its take drops.
//
// # Priorities
//
// Quorum queues in RabbitMQ 3.10 have no priorities: a topic's messages
// are delivered in the order they were published. The priority of a
// submit is stored and listed, but does not order claims.
package rabbitmq
