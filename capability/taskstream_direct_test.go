package capability_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

// TestAListenerOfAttemptsAcceptsOnlyTheClientTheHostHandedOver: a
// provider's listener serves the client whose certificate came through
// OpenTaskListener, refuses any other, and a client refuses a listener
// presenting another certificate than the one the host gave.
func TestAListenerOfAttemptsAcceptsOnlyTheClientTheHostHandedOver(t *testing.T) {
	client := capabilitytest.Connect(t, &streamProvider{capacity: 7})
	allowed, err := capability.SelfSignedCert()
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := capability.SelfSignedCert()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := client.OpenTaskListener(ctx, allowed.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if l.Network != "unix" || l.Address == "" || len(l.ServerCert) == 0 {
		t.Fatalf("listener = %+v; want a unix address and a certificate", l)
	}
	if c, err := capability.DirectCapacity(ctx, l, allowed); err != nil || c != 7 {
		t.Fatalf("the allowed client: capacity %d, %v; want 7", c, err)
	}
	if c, err := capability.DirectCapacity(ctx, l, stranger); err == nil {
		t.Fatalf("a client the host did not hand over got a stream (capacity %d)", c)
	}
	forged := l
	forged.ServerCert = stranger.Certificate[0]
	if c, err := capability.DirectCapacity(ctx, forged, allowed); err == nil {
		t.Fatalf("the client accepted a listener presenting another certificate (capacity %d)", c)
	}
	var bad *capability.InvalidArgumentError
	if _, err := client.OpenTaskListener(ctx, []byte("not a certificate")); !errors.As(err, &bad) {
		t.Fatalf("OpenTaskListener(garbage) = %v; want an invalid argument", err)
	}
}

// TestAListenerThatCannotBeReachedMakesTheStreamGoThroughTheHost: when the
// address a provider gave cannot be dialed from the caller (another
// network namespace, say), its attempts still run, relayed.
func TestAListenerThatCannotBeReachedMakesTheStreamGoThroughTheHost(t *testing.T) {
	s := newStreamSetup(t, &streamProvider{capacity: 4})
	s.host.ConnectTasksFunc = func(ctx context.Context, _ string, cert []byte) (capability.TaskListener, error) {
		s.direct.Add(1)
		l, err := s.client.OpenTaskListener(ctx, cert)
		l.Address += "-elsewhere"
		return l, err
	}
	for range 3 {
		res, err := s.runner.RunTask(context.Background(), "prov", capability.TaskRun{Task: "echo", Payload: json.RawMessage(`"on"`)}, nil)
		if err != nil || string(res) != `"on"` {
			t.Fatalf("RunTask = %s, %v", res, err)
		}
	}
	if d, r := s.direct.Load(), s.relayed.Load(); d != 1 || r != 1 {
		t.Fatalf("%d direct connections tried and %d streams relayed; want 1 and 1", d, r)
	}
}

// TestAFrameThatDoesNotParseEndsOnlyItsConnection: a client that sends a
// frame longer than the limit, bytes that are no TaskDispatch, or a frame
// cut short by its end of the connection loses its connection; the
// listener serves the next one.
func TestAFrameThatDoesNotParseEndsOnlyItsConnection(t *testing.T) {
	client := capabilitytest.Connect(t, &streamProvider{capacity: 5})
	cert, err := capability.SelfSignedCert()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := client.OpenTaskListener(ctx, cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		frame []byte
		end   bool // the client ends its side after it
	}{
		{[]byte{0xff, 0xff, 0xff, 0xff}, false},       // a length past the limit
		{[]byte{0, 0, 0, 3, 0xff, 0xff, 0xff}, false}, // no protobuf message
		{[]byte{0, 0, 0, 10, 1, 2}, true},             // cut short by the connection's end
	} {
		if err := capability.DirectSendRaw(ctx, l, cert, bad.frame, bad.end); err != nil {
			t.Fatalf("frame %x: %v; want the provider to close the connection after its capacity", bad.frame, err)
		}
	}
	if c, err := capability.DirectCapacity(ctx, l, cert); err != nil || c != 5 {
		t.Fatalf("after the bad frames: capacity %d, %v; want 5", c, err)
	}
}
