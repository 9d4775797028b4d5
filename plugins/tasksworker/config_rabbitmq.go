package tasksworker

// The rabbitmq broker's settings: amqp_url and state_store, checked
// without connecting.

import (
	"encoding/json"
	"errors"
	"net/url"
	"regexp"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// AMQPURLEnv is read for the RabbitMQ address when the config's amqp_url
// is empty.
const AMQPURLEnv = "TASKHOST_AMQP_URL"

// checkRabbitMQSettings checks amqp_url and state_store, and defaults the
// state store to local. The settings belong to the rabbitmq broker alone:
// another broker given them refuses them, so that a config that names a
// state store never runs with its tasks somewhere else.
func checkRabbitMQSettings(cfg *Config) error {
	if cfg.Broker != "rabbitmq" {
		if cfg.StateStore != "" {
			return invalid("state_store", "only the rabbitmq broker has a state store (this config's broker is %s); remove state_store, or set broker: rabbitmq", cfg.Broker)
		}
		if cfg.AMQPPrefix != "" {
			return invalid("amqp_prefix", "only the rabbitmq broker has queues to name (this config's broker is %s); remove amqp_prefix, or set broker: rabbitmq", cfg.Broker)
		}
		return nil
	}
	if cfg.AMQPURL == "" {
		return invalid("amqp_url", "the rabbitmq broker needs amqp_url, such as amqp://user:password@127.0.0.1:5672/ (or ${%s}, passed with env: [%s] in the host config)", AMQPURLEnv, AMQPURLEnv)
	}
	if err := checkAMQPURL(cfg.AMQPURL); err != nil {
		return err
	}
	if cfg.StateStore == "" {
		cfg.StateStore = "local"
	}
	if cfg.StateStore == "postgres" {
		return checkPostgresSettings(*cfg, "the rabbitmq broker's postgres state store")
	}
	return nil
}

// checkAMQPPrefix refuses a prefix the broker's names could not start
// with safely: they are dot-separated, and an operator types them.
func checkAMQPPrefix(p string, raw json.RawMessage) error {
	if len(p) > 100 || !amqpPrefixRE.MatchString(p) {
		return invalid("amqp_prefix", "must be 1 to 100 letters, digits, '_' or '-', starting with a letter, such as taskhost; got %s", clip(raw))
	}
	return nil
}

var amqpPrefixRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)

// checkAMQPURL reports a URL that can never connect. The message never
// repeats the URL, which may hold a password.
func checkAMQPURL(raw string) error {
	_, err := amqp.ParseURI(raw)
	if err == nil {
		return nil
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // without the URL
	}
	problem := strings.ReplaceAll(err.Error(), raw, "the address")
	problem, _, _ = strings.Cut(problem, " (if the username") // the library's long hint on escaping
	return invalid("amqp_url", "the address does not parse (%s); write it as amqp://user:password@host:5672/vhost or amqps://... (a password holding @, :, / or ? percent-encoded)", strings.TrimSuffix(problem, "."))
}
