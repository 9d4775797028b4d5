package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/taskhost/taskhost/client"
)

// The examples run against the host TestMain starts; hostURL is its
// address, such as "http://127.0.0.1:8080".

// Submit a task and wait until it is done.
func ExampleClient_Wait() {
	c := client.New(hostURL) // add client.WithToken(...) for a host with an admin_token
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id, err := c.Submit(ctx, client.Task{Task: "demo.echo", Payload: json.RawMessage(`{"hello":"world"}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	t, err := c.Wait(ctx, id)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(t.State, string(t.Result))
	// Output: done {"hello":"world"}
}

// The host's refusals are *APIError values with its message.
func ExampleAPIError() {
	c := client.New(hostURL)
	_, err := c.Submit(context.Background(), client.Task{Task: "no.such.task"})
	var ae *client.APIError
	if errors.As(err, &ae) {
		fmt.Println(ae.Status, client.IsBadRequest(err))
	}
	_, err = c.Get(context.Background(), "999999999")
	fmt.Println(client.IsNotFound(err))
	// Output:
	// 400 true
	// true
}

// Page through the tasks of one name, newest first.
func ExampleClient_List() {
	c := client.New(hostURL)
	ctx := context.Background()
	for range 3 {
		if _, err := c.Submit(ctx, client.Task{Task: "demo.sleep", Payload: json.RawMessage(`{"seconds":0}`), DelaySeconds: 600}); err != nil {
			fmt.Println(err)
			return
		}
	}
	f := client.Filter{Task: "demo.sleep", State: client.StateQueued, Limit: 2}
	n := 0
	for {
		page, err := c.List(ctx, f)
		if err != nil {
			fmt.Println(err)
			return
		}
		n += len(page.Tasks)
		if page.NextBefore == "" {
			break
		}
		f.Before = page.NextBefore
	}
	fmt.Println(n >= 3)
	// Output: true
}

// Create, disable and delete a schedule.
func ExampleClient_CreateSchedule() {
	c := client.New(hostURL)
	ctx := context.Background()
	s, err := c.CreateSchedule(ctx, client.ScheduleSpec{Name: "nightly", Task: "demo.echo", Cron: "0 3 * * *"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(s.Name, s.Timing, s.Enabled)
	off := false
	if s, err = c.UpdateSchedule(ctx, client.ScheduleSpec{Name: "nightly", Task: "demo.echo", Cron: "0 3 * * *", Enabled: &off}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(s.Enabled)
	fmt.Println(c.DeleteSchedule(ctx, "nightly"))
	// Output:
	// nightly cron 0 3 * * * true
	// false
	// <nil>
}

// Stream NDJSON (here from a string; a file or a pipe works the same),
// seeing each chunk as the host commits it.
func ExampleClient_SubmitNDJSON() {
	c := client.New(hostURL)
	ndjson := strings.NewReader(`{"task": "demo.echo", "payload": {"n": 1}}
{"task": "demo.echo", "payload": {"n": 2}}
{"task": "no.such.task"}
{"task": "demo.echo", "payload": {"n": 4}}
`)
	res, err := c.SubmitNDJSON(context.Background(), ndjson, client.WithProgress(func(ch client.Chunk) {
		fmt.Println("stored lines", ch.FirstLine, "to", ch.LastLine)
	}))
	var be *client.BatchError
	if errors.As(err, &be) {
		fmt.Println("stopped at line", be.Line, "with", res.Stored, "stored")
	}
	// Output:
	// stored lines 1 to 2
	// stopped at line 3 with 2 stored
}
