package redact

import (
	"fmt"

	"github.com/go-logr/logr"
)

// Logger is log with every message, error and string or error value
// redacted (Text) before it is written.
func Logger(log logr.Logger) logr.Logger {
	if log.GetSink() == nil {
		return log
	}
	if _, ok := log.GetSink().(sink); ok {
		return log
	}
	return logr.New(sink{log.GetSink()})
}

type sink struct{ logr.LogSink }

func (s sink) Info(level int, msg string, kv ...any) {
	s.LogSink.Info(level, Text(msg), values(kv)...)
}

func (s sink) Error(err error, msg string, kv ...any) {
	s.LogSink.Error(Error(err), Text(msg), values(kv)...)
}

func (s sink) WithValues(kv ...any) logr.LogSink { return sink{s.LogSink.WithValues(values(kv)...)} }
func (s sink) WithName(name string) logr.LogSink { return sink{s.LogSink.WithName(name)} }

// values redacts the values (not the keys) of key-value pairs.
func values(kv []any) []any {
	out := make([]any, len(kv))
	copy(out, kv)
	for i := 1; i < len(out); i += 2 {
		switch v := out[i].(type) {
		case string:
			out[i] = Text(v)
		case error:
			out[i] = Text(v.Error())
		case fmt.Stringer:
			out[i] = Text(v.String())
		}
	}
	return out
}
