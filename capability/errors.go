package capability

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// toStatus turns a Go error from plugin or host code into a gRPC status, so
// the other side can map it back with fromStatus.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var cfg *InvalidConfigError
	var arg *InvalidArgumentError
	switch {
	case errors.As(err, &cfg):
		return status.Error(codes.FailedPrecondition, cfg.Error())
	case errors.As(err, &arg):
		return status.Error(codes.InvalidArgument, arg.Error())
	case errors.Is(err, ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, ErrUnimplemented):
		return status.Error(codes.Unimplemented, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

// fromStatus maps a gRPC error back to this package's errors. what names
// the call, for context.
func fromStatus(what string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", what, err)
	}
	msg := st.Message()
	switch st.Code() {
	case codes.FailedPrecondition:
		return &InvalidConfigError{Problem: trimPrefix(msg, "invalid config: ")}
	case codes.InvalidArgument:
		return &InvalidArgumentError{Msg: msg}
	case codes.NotFound:
		return fmt.Errorf("%s: %s: %w", what, msg, ErrNotFound)
	case codes.Unavailable:
		return fmt.Errorf("%s: %s: %w", what, msg, ErrUnavailable)
	case codes.Unimplemented:
		return fmt.Errorf("%s: %w", what, ErrUnimplemented)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %s: %w", what, msg, context.DeadlineExceeded)
	case codes.Canceled:
		return fmt.Errorf("%s: %s: %w", what, msg, context.Canceled)
	}
	return fmt.Errorf("%s: %s", what, msg)
}

func trimPrefix(s, p string) string {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

func asTaskError(err error, target **TaskError) bool { return errors.As(err, target) }
