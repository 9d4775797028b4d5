package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
)

// Plugin is one plugin of the host with its state, as /admin/api/plugins
// gives it.
type Plugin struct {
	Name    string `json:"name"`
	Enabled bool   `json:"enabled"`
	// State is starting, running, backoff, failed, stopped or disabled.
	State        string          `json:"state"`
	Version      string          `json:"version"`
	Capabilities []string        `json:"capabilities"`
	PID          int             `json:"pid"`
	Restarts     int             `json:"restarts"`
	LastError    string          `json:"last_error"`
	Health       string          `json:"health"`
	StartedAt    time.Time       `json:"started_at"`
	Actions      json.RawMessage `json:"actions,omitempty"`
	Binary       string          `json:"binary"`
	Pinned       bool            `json:"pinned"`
}

// Plugins lists the host's plugins (an admin call: it needs the token on
// a host that has one).
func (c *Client) Plugins(ctx context.Context) ([]Plugin, error) {
	var out struct {
		Plugins []Plugin `json:"plugins"`
	}
	err := c.call(ctx, request{method: http.MethodGet, path: "/admin/api/plugins"}, &out)
	return out.Plugins, err
}

// ActionResult is what a plugin's admin action answered.
type ActionResult struct {
	Message string          `json:"message"`
	Result  json.RawMessage `json:"result"`
}

// Action runs a plugin's admin action with params (a JSON value, or nil).
// It is never retried.
func (c *Client) Action(ctx context.Context, plugin, action string, params json.RawMessage) (ActionResult, error) {
	var out ActionResult
	form := url.Values{}
	if params != nil {
		form.Set("params", string(params))
	}
	err := c.call(ctx, request{
		method: http.MethodPost, path: "/admin/plugins/" + url.PathEscape(plugin) + "/actions/" + url.PathEscape(action),
		query: form, admin: true, body: struct{}{},
	}, &out)
	return out, err
}

// Reclaim runs one orphan-reclaim pass now (tasks_worker's
// reclaim_orphaned_messages action) and returns what it did.
func (c *Client) Reclaim(ctx context.Context) (ActionResult, error) {
	return c.Action(ctx, "tasks_worker", "reclaim_orphaned_messages", nil)
}

// Topic is a topic's counts and settings.
type Topic struct {
	Name               string  `json:"name"`
	Queued             int     `json:"queued"`
	Running            int     `json:"running"`
	DeadLetter         int     `json:"dead_letter"`
	Subscribers        int     `json:"subscribers"`
	ConcurrencyLimit   int     `json:"concurrency_limit"`
	DeadLetterEnabled  bool    `json:"dead_letter_enabled"`
	Paused             bool    `json:"paused"`
	OldestClaimSeconds float64 `json:"oldest_claim_seconds"`
}

// Topics lists the topics with their counts.
func (c *Client) Topics(ctx context.Context) ([]Topic, error) {
	var out struct {
		Topics []Topic `json:"topics"`
	}
	err := c.call(ctx, request{method: http.MethodGet, path: apiPrefix + "/topics"}, &out)
	return out.Topics, err
}

// TopicPatch changes a topic's settings; nil fields stay as they are.
type TopicPatch struct {
	ConcurrencyLimit  *int  `json:"concurrency_limit,omitempty"`
	Paused            *bool `json:"paused,omitempty"`
	DeadLetterEnabled *bool `json:"dead_letter_enabled,omitempty"`
}

// SetTopic changes a topic's settings, such as pausing it (its queued
// tasks wait until it is resumed). Retried on a 503: setting twice is
// setting once.
func (c *Client) SetTopic(ctx context.Context, name string, p TopicPatch) error {
	return c.call(ctx, request{method: http.MethodPut, path: apiPrefix + "/topics/" + url.PathEscape(name), body: p, retry: true}, nil)
}
