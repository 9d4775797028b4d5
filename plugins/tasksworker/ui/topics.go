package ui

// The topics page (/ui/topics) and its forms: concurrency limit, pause,
// dead letters, drain and purge.

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

type topicsView struct {
	Err    string
	Topics []broker.TopicStats
	Served []string
}

func (u *UI) topics(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	d := topicsView{Served: svc.Served()}
	st, err := svc.Stats(r.Context())
	if err != nil {
		d.Err = brokerProblem("read the topics", err)
	}
	d.Topics = st.Topics
	u.render(w, r, svc, pageStatus(d.Err != ""), "topics", &page{Title: "Topics", D: d})
}

func (u *UI) topicAction(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	op := chi.URLParam(r, "op")
	topic := r.PostForm.Get("topic")
	if err := broker.ValidateTopicName(topic); err != nil {
		u.redirect(w, r, "/topics", "error", brokerProblem("change the topic", err), "")
		return
	}
	ctx := r.Context()
	var msg string
	var err error
	setBool := func(field string) (bool, bool) {
		v, perr := strconv.ParseBool(r.PostForm.Get(field))
		if perr != nil {
			u.redirect(w, r, "/topics", "error", fmt.Sprintf("The form's %s field must be true or false.", field), "")
			return false, false
		}
		return v, true
	}
	switch op {
	case "limit":
		s := strings.TrimSpace(r.PostForm.Get("limit"))
		n, perr := strconv.Atoi(s)
		if perr != nil || broker.ValidatePatch(broker.TopicPatch{ConcurrencyLimit: &n}) != nil {
			u.redirect(w, r, "/topics", "error", fmt.Sprintf("The concurrency limit of %s must be a whole number from 0 (unlimited) to %d; %q is not.", topic, broker.MaxConcurrencyLimit, s), "")
			return
		}
		_, err = svc.SetTopic(ctx, topic, broker.TopicPatch{ConcurrencyLimit: &n})
		msg = fmt.Sprintf("Topic %s: at most %s running at once.", topic, funcs["limit"].(func(int) string)(n))
	case "pause":
		v, ok := setBool("paused")
		if !ok {
			return
		}
		_, err = svc.SetTopic(ctx, topic, broker.TopicPatch{Paused: &v})
		msg = fmt.Sprintf("Topic %s resumed: its queued tasks are claimed again.", topic)
		if v {
			msg = fmt.Sprintf("Topic %s paused: no new claims; running tasks finish.", topic)
		}
	case "dead-letters":
		v, ok := setBool("enabled")
		if !ok {
			return
		}
		_, err = svc.SetTopic(ctx, topic, broker.TopicPatch{DeadLetterEnabled: &v})
		msg = fmt.Sprintf("Topic %s: tasks that fail for good now end failed (no dead letters).", topic)
		if v {
			msg = fmt.Sprintf("Topic %s: tasks that fail for good now become dead letters.", topic)
		}
	case "drain":
		err = svc.Drain(ctx, topic)
		msg = fmt.Sprintf("Topic %s is draining: it takes no new work, and its running tasks finish. Resume it to take work again.", topic)
	case "purge":
		deadLetters := r.PostForm.Get("dead_letters") != ""
		var res broker.PurgeResult
		res, err = svc.Purge(ctx, topic, deadLetters)
		msg = fmt.Sprintf("Topic %s purged: %d queued task(s) deleted", topic, res.Queued)
		if deadLetters {
			msg += fmt.Sprintf(", and %d dead letter(s)", res.DeadLetter)
		}
		msg += ". Running tasks were left alone."
	default:
		u.problem(w, r, http.StatusNotFound, "Not found", fmt.Sprintf("There is no topic action %q.", op))
		return
	}
	u.audit(r, "topic "+op, "topic", topic, "error", err)
	if err != nil {
		u.redirect(w, r, "/topics", "error", brokerProblem(fmt.Sprintf("%s topic %s", op, topic), err), "")
		return
	}
	u.redirect(w, r, "/topics", "ok", msg, "")
}
