package postgres

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// This file owns the binary encoding of the arrays the hot statements send
// (an ack sends 13 of them, one element per claim). pgx encodes an array
// element by element through its generic plans, boxing each element in an
// interface: an allocation per element on the hottest path. The plans
// here write the same bytes (PostgreSQL's array_send format) straight from
// the Go slices. registerArrays puts them on each connection the broker
// opens; a value of any other type, or the text format, goes to the type's
// own codec, so nothing else changes.

// arrayEncoders are the array types that take the direct plans, by the
// OID of the array type, with the OID of the element type.
var arrayEncoders = []struct{ array, elem uint32 }{
	{pgtype.Int8ArrayOID, pgtype.Int8OID},
	{pgtype.Int4ArrayOID, pgtype.Int4OID},
	{pgtype.Float8ArrayOID, pgtype.Float8OID},
	{pgtype.TextArrayOID, pgtype.TextOID},
	{pgtype.TimestamptzArrayOID, pgtype.TimestamptzOID},
}

// registerArrays wraps the codecs of arrayEncoders's types in m with
// directArrays, whose plans share one paramScratch: m must be one
// connection's, as each connection's statements are built one at a time.
func registerArrays(m *pgtype.Map) {
	s := new(paramScratch)
	for _, a := range arrayEncoders {
		t, ok := m.TypeForOID(a.array)
		if !ok {
			continue
		}
		if _, done := t.Codec.(directArrays); done {
			continue
		}
		m.RegisterType(&pgtype.Type{Name: t.Name, OID: t.OID, Codec: directArrays{Codec: t.Codec, elem: a.elem, scratch: s}})
	}
}

// directArrays is an array type's codec with direct binary plans for the
// Go slices whose elements match the type's element type (elem).
type directArrays struct {
	pgtype.Codec
	elem    uint32
	scratch *paramScratch
}

func (c directArrays) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if format == pgtype.BinaryFormatCode {
		if p := directPlan(c.elem, value); p != nil {
			return scratchPlan{arrayEncoder: p, scratch: c.scratch}
		}
	}
	return c.Codec.PlanEncode(m, oid, format, value)
}

// arrayEncoder appends one slice type's array to buf, making room with s.
type arrayEncoder interface {
	encode(value any, buf []byte, s *paramScratch) ([]byte, error)
}

// scratchPlan is a direct plan as a connection's Map uses it: with the
// connection's scratch buffer.
type scratchPlan struct {
	arrayEncoder
	scratch *paramScratch
}

func (p scratchPlan) Encode(value any, buf []byte) ([]byte, error) {
	return p.encode(value, buf, p.scratch)
}

// The direct plans, one per slice type.
var (
	int8Plan = &fixedArray[int64]{elem: pgtype.Int8OID, size: 8, put: func(b []byte, v int64) []byte {
		return binary.BigEndian.AppendUint64(b, uint64(v))
	}}
	int4Plan = &fixedArray[int32]{elem: pgtype.Int4OID, size: 4, put: func(b []byte, v int32) []byte {
		return binary.BigEndian.AppendUint32(b, uint32(v))
	}}
	float8Plan = &fixedArray[float64]{elem: pgtype.Float8OID, size: 8, put: func(b []byte, v float64) []byte {
		return binary.BigEndian.AppendUint64(b, math.Float64bits(v))
	}}
	textPlan     = &varArray[string]{elem: pgtype.TextOID, size: textSize, put: appendText}
	nullTextPlan = &varArray[*string]{elem: pgtype.TextOID, null: isNilPtr[string],
		size: func(s *string) int { return textSize(*s) }, put: func(b []byte, s *string) []byte { return appendText(b, *s) }}
	timestamptzPlan = &varArray[*time.Time]{elem: pgtype.TimestamptzOID, null: isNilPtr[time.Time],
		size: func(*time.Time) int { return 8 }, put: appendTimestamptz}
)

// directPlan is the direct encoder of value's slice type for elements of
// type elem, or nil when there is none.
func directPlan(elem uint32, value any) arrayEncoder {
	switch elem {
	case pgtype.Int8OID:
		if _, ok := value.([]int64); ok {
			return int8Plan
		}
	case pgtype.Int4OID:
		if _, ok := value.([]int32); ok {
			return int4Plan
		}
	case pgtype.Float8OID:
		if _, ok := value.([]float64); ok {
			return float8Plan
		}
	case pgtype.TextOID:
		switch value.(type) {
		case []string:
			return textPlan
		case []*string:
			return nullTextPlan
		}
	case pgtype.TimestamptzOID:
		if _, ok := value.([]*time.Time); ok {
			return timestamptzPlan
		}
	}
	return nil
}

// arrayHeaderSize is the size of what arrayHeader appends.
const arrayHeaderSize = 20

// arrayHeader appends the header of a one-dimensional array of n elements
// of type elem (lower bound 1), as pgx writes it, and returns where the
// has-nulls flag is.
func arrayHeader(buf []byte, elem uint32, n int) ([]byte, int) {
	buf = binary.BigEndian.AppendUint32(buf, 1) // dimensions
	flag := len(buf)
	buf = binary.BigEndian.AppendUint32(buf, 0) // has nulls
	buf = binary.BigEndian.AppendUint32(buf, elem)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	return binary.BigEndian.AppendUint32(buf, 1), flag
}

// paramScratch is the buffer a connection's array parameters are written
// to when the one pgx gives is too small. pgx starts each statement's
// parameters in a buffer of 256 bytes (it drops a bigger one at the next
// statement), and an ack's take about 5 kB: growing a new buffer for each
// statement was a seventh of the bytes a burn-down allocated. pgx builds a
// statement's parameters and copies them into its Bind message before it
// builds the next statement's (Conn.SendBatch, Query and Exec alike), so
// a statement's parameters are dead once the next one's are built, and
// the next one reuses the scratch from its start.
type paramScratch struct{ buf []byte }

// growBy returns buf with room for n more bytes: buf itself when it has
// the room, else buf's bytes copied to the start of the scratch, grown to
// at least minParamBuffer when too small.
func (s *paramScratch) growBy(buf []byte, n int) []byte {
	if cap(buf)-len(buf) >= n {
		return buf
	}
	need := len(buf) + n
	if cap(s.buf) < need {
		s.buf = make([]byte, 0, max(2*cap(s.buf), need, minParamBuffer))
	}
	// buf is pgx's buffer, or the scratch itself when it is too small: copy
	// handles both.
	grown := s.buf[:len(buf)]
	copy(grown, buf)
	return grown
}

const minParamBuffer = 4096

// fixedArray is the plan of a []T whose elements are never NULL and take
// size bytes each, appended by put.
type fixedArray[T any] struct {
	elem uint32
	size int
	put  func(buf []byte, v T) []byte
}

func (p *fixedArray[T]) encode(value any, buf []byte, s *paramScratch) ([]byte, error) {
	v := value.([]T)
	if v == nil {
		return nil, nil
	}
	buf = s.growBy(buf, arrayHeaderSize+len(v)*(4+p.size))
	buf, _ = arrayHeader(buf, p.elem, len(v))
	for _, x := range v {
		buf = binary.BigEndian.AppendUint32(buf, uint32(p.size))
		buf = p.put(buf, x)
	}
	return buf, nil
}

// varArray is the plan of a []T whose elements are NULL when null says so
// (never when null is nil) and otherwise take size bytes, appended by put.
type varArray[T any] struct {
	elem uint32
	null func(v T) bool
	size func(v T) int
	put  func(buf []byte, v T) []byte
}

func (p *varArray[T]) encode(value any, buf []byte, s *paramScratch) ([]byte, error) {
	v := value.([]T)
	if v == nil {
		return nil, nil
	}
	total := arrayHeaderSize + 4*len(v)
	for _, x := range v {
		if p.null == nil || !p.null(x) {
			total += p.size(x)
		}
	}
	buf = s.growBy(buf, total)
	buf, flag := arrayHeader(buf, p.elem, len(v))
	for _, x := range v {
		if p.null != nil && p.null(x) {
			buf = binary.BigEndian.AppendUint32(buf, math.MaxUint32) // NULL
			binary.BigEndian.PutUint32(buf[flag:], 1)                // the array has nulls
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(p.size(x)))
		buf = p.put(buf, x)
	}
	return buf, nil
}

// isNilPtr reports whether v is nil.
func isNilPtr[E any](v *E) bool { return v == nil }

// textSize is the size of a text element.
func textSize(s string) int { return len(s) }

// appendText appends a text element's bytes.
func appendText(buf []byte, s string) []byte { return append(buf, s...) }

// microsFromUnixToY2K is PostgreSQL's epoch (2000-01-01 UTC) in
// microseconds since the Unix epoch.
const microsFromUnixToY2K = 946_684_800 * 1_000_000

// appendTimestamptz appends a timestamptz element, as pgx writes a
// time.Time: the sub-microsecond part is dropped.
func appendTimestamptz(buf []byte, t *time.Time) []byte {
	us := t.Unix()*1_000_000 + int64(t.Nanosecond())/1000 - microsFromUnixToY2K
	return binary.BigEndian.AppendUint64(buf, uint64(us))
}
