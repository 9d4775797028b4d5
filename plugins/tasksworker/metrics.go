package tasksworker

// The plugin's Prometheus registry: broker gauges read at scrape time and
// the process-local task counters.

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/rabbitmq"
	"github.com/taskhost/taskhost/worker"
)

// statsTimeout bounds the broker.Stats call of one scrape.
const statsTimeout = 5 * time.Second

// telemetry is the plugin's own Prometheus registry: the broker gauges,
// read at scrape time, and the process-local task counters, fed by the
// worker pool as its Observer. Metric names are a public interface (alert
// rules select them by name): never rename one in place.
type telemetry struct {
	reg *prometheus.Registry

	submitted, completed, failed          prometheus.Counter
	submittedPer, completedPer, failedPer *prometheus.CounterVec
	cancelled                             prometheus.Counter
	cancelledPer                          *prometheus.CounterVec
	running                               prometheus.Gauge
	duration                              *prometheus.HistogramVec
	reportsDropped                        prometheus.Counter
	straysRequeued                        prometheus.Counter
	rejected, republished                 *prometheus.CounterVec
}

var _ worker.Observer = (*telemetry)(nil)

// statusCancelled is the observer's status of an attempt that ended
// cancelled (worker.StatusCancelled).
const statusCancelled = broker.StateCancelled

// durationBuckets run from a millisecond to over an hour, by factors of 4,
// so that a no-op task and an hour-long one each land in a bucket of
// their own.
var durationBuckets = prometheus.ExponentialBuckets(0.001, 4, 12)

// newTelemetry builds the registry: stats and lastBeat are read at each
// scrape, and so is missing (the messages the rabbitmq broker's topic
// queues lacked at its last looks).
func newTelemetry(stats func(ctx context.Context) (broker.Stats, bool, error), lastBeat func() (time.Time, bool), missing func() int, log hclog.Logger) *telemetry {
	t := &telemetry{
		reg: prometheus.NewRegistry(),
		submitted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fastpluggy_tasks_submitted_total",
			Help: "Tasks submitted through this process since it started.",
		}),
		completed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fastpluggy_tasks_completed_total",
			Help: "Task attempts run by this process that succeeded, since it started.",
		}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fastpluggy_tasks_failed_total",
			Help: "Task attempts run by this process that failed (error, panic or timeout; each retry counts), since it started.",
		}),
		submittedPer: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fastpluggy_tasks_submitted_per_topic_total",
			Help: "Tasks submitted through this process, by topic.",
		}, []string{"topic"}),
		completedPer: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fastpluggy_tasks_completed_per_topic_total",
			Help: "Successful task attempts run by this process, by topic.",
		}, []string{"topic"}),
		failedPer: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fastpluggy_tasks_failed_per_topic_total",
			Help: "Failed task attempts run by this process, by topic.",
		}, []string{"topic"}),
		cancelled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fastpluggy_tasks_cancelled_total",
			Help: "Tasks that ended cancelled through this process since it started: queued ones it cancelled, and running attempts it ran that ended cancelled.",
		}),
		cancelledPer: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fastpluggy_tasks_cancelled_per_topic_total",
			Help: "Tasks that ended cancelled through this process, by topic.",
		}, []string{"topic"}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fastpluggy_tasks_running",
			Help: "Messages this process is handling now.",
		}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fastpluggy_tasks_duration_seconds",
			Help:    "Run time of the task attempts that succeeded or failed in this process, by topic.",
			Buckets: durationBuckets,
		}, []string{"topic"}),
		reportsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fastpluggy_tasks_reports_dropped_total",
			Help: "Reports of lost attempts this process did not store (its report writer's queue was full, or the database refused them after retries), since it started. Every other report is written with its attempt's outcome, in one transaction, and is never dropped.",
		}),
		straysRequeued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fastpluggy_tasks_strays_requeued_total",
			Help: "Messages this process's worker found running under its id without holding them (their claim committed and its answer was lost) and requeued, since it started.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fastpluggy_broker_deliveries_rejected_total",
			Help: "Deliveries the rabbitmq broker of this process moved to their topic's rejected queue (<prefix>.t.<topic>.rejected) instead of taking them, since it started, by reason: " +
				"other_store, a task of another state store on this amqp_prefix, which waits in that store (give each state store its own amqp_prefix); " +
				"not_a_task, a message the broker did not publish. Always 0 on the other brokers, which take no deliveries.",
		}, []string{"reason"}),
		republished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fastpluggy_broker_messages_republished_total",
			Help: "Queued messages the rabbitmq broker of this process published again because their topic queue had lost them, since it started, by reason: " +
				"missing, the topic queue held fewer messages than the state store's queued rows it should hold, at every look for a publish lease " +
				"(purged by an operator, or lost by RabbitMQ); the oldest were published again. Always 0 on the other brokers, whose queue is the store.",
		}, []string{"reason"}),
	}
	// Every reason is there from the start, at 0, so that an increase is
	// seen from the first one.
	for _, r := range []string{rabbitmq.RejectedOtherStore, rabbitmq.RejectedNotATask} {
		t.rejected.WithLabelValues(r)
	}
	t.republished.WithLabelValues(rabbitmq.RepublishedMissing)
	missingGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fastpluggy_broker_messages_missing",
		Help: "Queued messages (available, and published) that the topic queues in RabbitMQ lacked at this process's last look at each topic it uses, once two looks in a row found the topic short: " +
			"0 while they hold what the state store has queued; above 0 after a purge or a loss in RabbitMQ until the broker has published them again, " +
			"which it does once a topic has been short for a publish lease (fastpluggy_broker_messages_republished_total). Always 0 on the other brokers.",
	}, func() float64 { return float64(missing()) })
	t.reg.MustRegister(
		t.submitted, t.completed, t.failed,
		t.submittedPer, t.completedPer, t.failedPer,
		t.cancelled, t.cancelledPer,
		t.running, t.duration, t.reportsDropped, t.straysRequeued, t.rejected,
		t.republished, missingGauge,
		&brokerCollector{stats: stats, log: log},
		heartbeatCollector(lastBeat),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return t
}

// Submitted counts one message submitted to topic.
func (t *telemetry) Submitted(topic string) {
	t.submitted.Inc()
	t.submittedPer.WithLabelValues(topic).Inc()
}

// Rejected counts one delivery the rabbitmq broker moved to its topic's
// rejected queue, by reason (rabbitmq.Options.Rejected).
func (t *telemetry) Rejected(reason string) { t.rejected.WithLabelValues(reason).Inc() }

// Republished counts n messages the rabbitmq broker published again, by
// reason (rabbitmq.Options.Republished).
func (t *telemetry) Republished(reason string, n int) {
	t.republished.WithLabelValues(reason).Add(float64(n))
}

// Cancelled counts n tasks of topic that ended cancelled; an empty topic
// (not known) counts in the total only.
func (t *telemetry) Cancelled(topic string, n int) {
	t.cancelled.Add(float64(n))
	if topic != "" {
		t.cancelledPer.WithLabelValues(topic).Add(float64(n))
	}
}

// TaskStarted implements worker.Observer.
func (t *telemetry) TaskStarted(string) { t.running.Inc() }

// TaskFinished implements worker.Observer. Only done, failed and
// cancelled attempts are counted: a lost attempt's outcome belongs to
// whoever took the message back, and skipped, deferred and stopped ones
// never ran to an end. A cancelled attempt counts in the cancelled
// counters, not in the run-time histogram.
func (t *telemetry) TaskFinished(topic, _, status string, d time.Duration) {
	t.running.Dec()
	switch status {
	case statusCancelled:
		t.Cancelled(topic, 1)
		return
	case worker.StatusDone:
		t.completed.Inc()
		t.completedPer.WithLabelValues(topic).Inc()
	case worker.StatusFailed:
		t.failed.Inc()
		t.failedPer.WithLabelValues(topic).Inc()
	default:
		return
	}
	t.duration.WithLabelValues(topic).Observe(d.Seconds())
}

// exposition renders every metric in the text format.
func (t *telemetry) exposition(log hclog.Logger) ([]byte, string, error) {
	mfs, err := t.reg.Gather()
	if err != nil {
		if len(mfs) == 0 {
			return nil, "", fmt.Errorf("gather metrics: %w", err)
		}
		// Partial results beat none: one bad collector must not hide the rest.
		log.Warn("some metrics could not be gathered", "error", err)
	}
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, format)
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return nil, "", fmt.Errorf("encode metric %s: %w", mf.GetName(), err)
		}
	}
	return buf.Bytes(), string(format), nil
}

var descHeartbeatAge = prometheus.NewDesc("fastpluggy_tasks_heartbeat_age_seconds",
	"Seconds since this process's worker last stamped its heartbeat in the broker; emitted while the worker runs. "+
		"Growing past a few heartbeat intervals: the broker refuses its writes (database down, disk full), and the other workers "+
		"will take it for dead after orphan_reclaim_after_seconds.", nil, nil)

// heartbeatCollector exports the age of the worker's last heartbeat, read
// at scrape time; nothing while no worker runs.
type heartbeatCollector func() (time.Time, bool)

func (c heartbeatCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descHeartbeatAge }

func (c heartbeatCollector) Collect(ch chan<- prometheus.Metric) {
	if at, ok := c(); ok {
		ch <- prometheus.MustNewConstMetric(descHeartbeatAge, prometheus.GaugeValue, max(0, time.Since(at).Seconds()))
	}
}

// brokerCollector reads broker.Stats at scrape time. When there is no
// broker or Stats fails it emits nothing: a missing series is honest, a
// stale or zero one would lie.
type brokerCollector struct {
	stats func(ctx context.Context) (broker.Stats, bool, error)
	log   hclog.Logger
}

var (
	descTopics = prometheus.NewDesc("fastpluggy_broker_topics",
		"Topics the broker knows.", nil, nil)
	descWorkers = prometheus.NewDesc("fastpluggy_broker_workers",
		"Live workers (recent heartbeat) across every process sharing the broker.", nil, nil)
	descLocks = prometheus.NewDesc("fastpluggy_broker_locks",
		"Task locks held now.", nil, nil)
	descTopicQueued = prometheus.NewDesc("fastpluggy_broker_topic_queued",
		"Messages waiting in the topic's queue (delayed ones included).", []string{"topic"}, nil)
	descTopicRunning = prometheus.NewDesc("fastpluggy_broker_topic_running",
		"Messages of the topic claimed and running: the count its concurrency limit gates on.", []string{"topic"}, nil)
	descTopicDead = prometheus.NewDesc("fastpluggy_broker_topic_dead_letter",
		"Dead-lettered messages of the topic.", []string{"topic"}, nil)
	descTopicSubscribers = prometheus.NewDesc("fastpluggy_broker_topic_subscribers",
		"Live workers that claim from the topic.", []string{"topic"}, nil)
	descTopicPaused = prometheus.NewDesc("fastpluggy_broker_topic_paused",
		"1 while the topic is paused (or drained): no worker claims from it, so its queue waits.", []string{"topic"}, nil)
	descQueued = prometheus.NewDesc("fastpluggy_broker_messages_queued_total",
		"Queued messages across all topics (a gauge: the name is fixed by the spec).", nil, nil)
	descRunning = prometheus.NewDesc("fastpluggy_broker_messages_running_total",
		"Running messages across all topics (a gauge: the name is fixed by the spec).", nil, nil)
	descBeats = prometheus.NewDesc("fastpluggy_broker_beats",
		"Live workers with the beat role; 0 means no scheduler runs anywhere.", nil, nil)
	descOldestClaim = prometheus.NewDesc("fastpluggy_broker_oldest_running_claim_seconds",
		"Age of the topic's oldest running claim; emitted only while the topic has one. A wedged topic's only grows.", []string{"topic"}, nil)
)

func (c *brokerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descTopics, descWorkers, descLocks, descTopicQueued, descTopicRunning, descTopicDead,
		descTopicSubscribers, descTopicPaused, descQueued, descRunning, descBeats, descOldestClaim,
	} {
		ch <- d
	}
}

func (c *brokerCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), statsTimeout)
	defer cancel()
	st, ok, err := c.stats(ctx)
	if !ok {
		return
	}
	if err != nil {
		c.log.Warn("broker stats failed: the broker gauges are left out of this scrape", "error", err)
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	var queued, running int
	for _, t := range st.Topics {
		gauge(descTopicQueued, float64(t.Queued), t.Name)
		gauge(descTopicRunning, float64(t.Running), t.Name)
		gauge(descTopicDead, float64(t.DeadLetter), t.Name)
		gauge(descTopicSubscribers, float64(t.Subscribers), t.Name)
		gauge(descTopicPaused, boolGauge(t.Paused), t.Name)
		if t.Running > 0 {
			gauge(descOldestClaim, t.OldestClaimAge.Seconds(), t.Name)
		}
		queued += t.Queued
		running += t.Running
	}
	gauge(descTopics, float64(len(st.Topics)))
	gauge(descWorkers, float64(st.Workers))
	gauge(descLocks, float64(st.Locks))
	gauge(descQueued, float64(queued))
	gauge(descRunning, float64(running))
	gauge(descBeats, float64(st.Beats))
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// counterValue is a counter's value now.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if c.Write(&m) != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
