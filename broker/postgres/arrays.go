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
// interface: in a burn-down that was 11% of the process's CPU. The plans
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
// directArrays.
func registerArrays(m *pgtype.Map) {
	for _, a := range arrayEncoders {
		t, ok := m.TypeForOID(a.array)
		if !ok {
			continue
		}
		if _, done := t.Codec.(directArrays); done {
			continue
		}
		m.RegisterType(&pgtype.Type{Name: t.Name, OID: t.OID, Codec: directArrays{Codec: t.Codec, elem: a.elem}})
	}
}

// directArrays is an array type's codec with direct binary plans for the
// Go slices whose elements match the type's element type (elem).
type directArrays struct {
	pgtype.Codec
	elem uint32
}

func (c directArrays) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if format == pgtype.BinaryFormatCode {
		if p := directPlan(c.elem, value); p != nil {
			return p
		}
	}
	return c.Codec.PlanEncode(m, oid, format, value)
}

// directPlan is the direct plan of value's slice type for elements of
// type elem, or nil when there is none.
func directPlan(elem uint32, value any) pgtype.EncodePlan {
	switch elem {
	case pgtype.Int8OID:
		if _, ok := value.([]int64); ok {
			return int8Array{}
		}
	case pgtype.Int4OID:
		if _, ok := value.([]int32); ok {
			return int4Array{}
		}
	case pgtype.Float8OID:
		if _, ok := value.([]float64); ok {
			return float8Array{}
		}
	case pgtype.TextOID:
		switch value.(type) {
		case []string:
			return textArray{}
		case []*string:
			return nullTextArray{}
		}
	case pgtype.TimestamptzOID:
		if _, ok := value.([]*time.Time); ok {
			return timestamptzArray{}
		}
	}
	return nil
}

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

// fixedArray appends the array of n fixed-size elements, each appended by
// put.
func fixedArray(buf []byte, elem uint32, n, size int, put func(buf []byte, i int) []byte) []byte {
	buf, _ = arrayHeader(buf, elem, n)
	buf = growBy(buf, n*(4+size))
	for i := range n {
		buf = binary.BigEndian.AppendUint32(buf, uint32(size))
		buf = put(buf, i)
	}
	return buf
}

// growBy makes room in buf for n more bytes. pgx starts each statement's
// parameters in a buffer of 256 bytes, and an ack's take about 5 kB: the
// first array grows it to at least minParamBuffer, so an ack's arrays
// grow it once or twice rather than at every array.
func growBy(buf []byte, n int) []byte {
	if cap(buf)-len(buf) >= n {
		return buf
	}
	grown := make([]byte, len(buf), max(2*cap(buf), len(buf)+n, minParamBuffer))
	copy(grown, buf)
	return grown
}

const minParamBuffer = 4096

// setNulls marks the array whose has-nulls flag is at flag as holding a
// NULL.
func setNulls(buf []byte, flag int) { binary.BigEndian.PutUint32(buf[flag:], 1) }

// appendNull appends a NULL element.
func appendNull(buf []byte) []byte { return binary.BigEndian.AppendUint32(buf, math.MaxUint32) }

type int8Array struct{}

func (int8Array) Encode(value any, buf []byte) ([]byte, error) {
	v := value.([]int64)
	if v == nil {
		return nil, nil
	}
	return fixedArray(buf, pgtype.Int8OID, len(v), 8, func(b []byte, i int) []byte {
		return binary.BigEndian.AppendUint64(b, uint64(v[i]))
	}), nil
}

type int4Array struct{}

func (int4Array) Encode(value any, buf []byte) ([]byte, error) {
	v := value.([]int32)
	if v == nil {
		return nil, nil
	}
	return fixedArray(buf, pgtype.Int4OID, len(v), 4, func(b []byte, i int) []byte {
		return binary.BigEndian.AppendUint32(b, uint32(v[i]))
	}), nil
}

type float8Array struct{}

func (float8Array) Encode(value any, buf []byte) ([]byte, error) {
	v := value.([]float64)
	if v == nil {
		return nil, nil
	}
	return fixedArray(buf, pgtype.Float8OID, len(v), 8, func(b []byte, i int) []byte {
		return binary.BigEndian.AppendUint64(b, math.Float64bits(v[i]))
	}), nil
}

type textArray struct{}

func (textArray) Encode(value any, buf []byte) ([]byte, error) {
	v := value.([]string)
	if v == nil {
		return nil, nil
	}
	buf, _ = arrayHeader(buf, pgtype.TextOID, len(v))
	size := 4 * len(v)
	for _, s := range v {
		size += len(s)
	}
	buf = growBy(buf, size)
	for _, s := range v {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
		buf = append(buf, s...)
	}
	return buf, nil
}

type nullTextArray struct{}

func (nullTextArray) Encode(value any, buf []byte) ([]byte, error) {
	v := value.([]*string)
	if v == nil {
		return nil, nil
	}
	buf, flag := arrayHeader(buf, pgtype.TextOID, len(v))
	size := 4 * len(v)
	for _, s := range v {
		if s != nil {
			size += len(*s)
		}
	}
	buf = growBy(buf, size)
	for _, s := range v {
		if s == nil {
			buf = appendNull(buf)
			setNulls(buf, flag)
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(*s)))
		buf = append(buf, *s...)
	}
	return buf, nil
}

// microsFromUnixToY2K is PostgreSQL's epoch (2000-01-01 UTC) in
// microseconds since the Unix epoch.
const microsFromUnixToY2K = 946_684_800 * 1_000_000

type timestamptzArray struct{}

func (timestamptzArray) Encode(value any, buf []byte) ([]byte, error) {
	v := value.([]*time.Time)
	if v == nil {
		return nil, nil
	}
	buf, flag := arrayHeader(buf, pgtype.TimestamptzOID, len(v))
	buf = growBy(buf, 12*len(v))
	for _, t := range v {
		if t == nil {
			buf = appendNull(buf)
			setNulls(buf, flag)
			continue
		}
		// As pgx writes a time.Time: the sub-microsecond part is dropped.
		us := t.Unix()*1_000_000 + int64(t.Nanosecond())/1000 - microsFromUnixToY2K
		buf = binary.BigEndian.AppendUint32(buf, 8)
		buf = binary.BigEndian.AppendUint64(buf, uint64(us))
	}
	return buf, nil
}
