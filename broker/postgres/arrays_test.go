package postgres

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// arrayCases are values of every slice type with a direct plan (and one
// without), with the array type each is sent as.
func arrayCases() []struct {
	name  string
	oid   uint32
	cast  string
	value any
} {
	s := func(v string) *string { return &v }
	t1 := time.Date(2026, 12, 3, 7, 30, 1, 123456789, time.FixedZone("x", 3600))
	t2 := time.Date(1999, 12, 31, 23, 59, 59, 999, time.UTC)
	t3 := time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	return []struct {
		name  string
		oid   uint32
		cast  string
		value any
	}{
		{"int8", pgtype.Int8ArrayOID, "int8[]", []int64{1, -1, math.MaxInt64, math.MinInt64, 0}},
		{"int8 empty", pgtype.Int8ArrayOID, "int8[]", []int64{}},
		{"int8 nil", pgtype.Int8ArrayOID, "int8[]", []int64(nil)},
		{"int4", pgtype.Int4ArrayOID, "int4[]", []int32{7, -7, math.MaxInt32, math.MinInt32}},
		{"float8", pgtype.Float8ArrayOID, "float8[]", []float64{0, -0.5, 1e300, math.Inf(1), math.Inf(-1), math.NaN(), 8.863e-06}},
		{"text", pgtype.TextArrayOID, "text[]", []string{"", "a", "é ✓ 日本", "with \"quotes\", {braces} and \\"}},
		{"text empty", pgtype.TextArrayOID, "text[]", []string{}},
		{"nullable text", pgtype.TextArrayOID, "text[]", []*string{s("x"), nil, s(""), nil}},
		{"nullable text none null", pgtype.TextArrayOID, "text[]", []*string{s("y")}},
		{"nullable text nil", pgtype.TextArrayOID, "text[]", []*string(nil)},
		{"timestamptz", pgtype.TimestamptzArrayOID, "timestamptz[]", []*time.Time{&t1, nil, &t2, &t3}},
		{"timestamptz no null", pgtype.TimestamptzArrayOID, "timestamptz[]", []*time.Time{&t1}},
		// No direct plan: pgx's own.
		{"int4 as int8", pgtype.Int8ArrayOID, "int8[]", []int32{1, 2}},
		{"bool", pgtype.BoolArrayOID, "bool[]", []bool{true, false}},
	}
}

// TestDirectArraysEncodeAsPgx: the direct plans write byte for byte what
// pgx's generic ones write, and are the plans a connection of the broker
// uses.
func TestDirectArraysEncodeAsPgx(t *testing.T) {
	plain, direct := pgtype.NewMap(), pgtype.NewMap()
	registerArrays(direct)
	registerArrays(direct) // twice: no double wrapping
	for _, c := range arrayCases() {
		want, err := plain.Encode(c.oid, pgtype.BinaryFormatCode, c.value, nil)
		if err != nil {
			t.Fatalf("%s: pgx: %v", c.name, err)
		}
		got, err := direct.Encode(c.oid, pgtype.BinaryFormatCode, c.value, nil)
		if err != nil {
			t.Fatalf("%s: direct: %v", c.name, err)
		}
		if !bytes.Equal(got, want) || (got == nil) != (want == nil) {
			t.Errorf("%s: direct encoding\n%x\nwant (pgx)\n%x", c.name, got, want)
		}
		// Text format: the type's own codec.
		wantText, err1 := plain.Encode(c.oid, pgtype.TextFormatCode, c.value, nil)
		gotText, err2 := direct.Encode(c.oid, pgtype.TextFormatCode, c.value, nil)
		if (err1 == nil) != (err2 == nil) || !bytes.Equal(gotText, wantText) {
			t.Errorf("%s: text format %q (%v), want %q (%v)", c.name, gotText, err2, wantText, err1)
		}
	}
	for _, v := range []any{[]int64{}, []int32{}, []float64{}, []string{}, []*string{}, []*time.Time{}} {
		found := false
		for _, a := range arrayEncoders {
			plan := direct.PlanEncode(a.array, pgtype.BinaryFormatCode, v)
			if want := directPlan(a.elem, v); want != nil {
				found = true
				if sp, ok := plan.(scratchPlan); !ok || sp.arrayEncoder != want || sp.scratch == nil {
					t.Errorf("%T as %d: plan %#v, want the direct one with the connection's scratch", v, a.array, plan)
				}
			}
		}
		if !found {
			t.Errorf("%T: no direct plan", v)
		}
	}
}

// TestDirectArraysRoundTrip: PostgreSQL reads what the direct plans send as
// it reads pgx's encoding.
func TestDirectArraysRoundTrip(t *testing.T) {
	ctx := context.Background()
	plain, direct := connect(t), connect(t)
	registerArrays(direct.TypeMap())
	for _, c := range arrayCases() {
		var want, got *string
		if err := plain.QueryRow(ctx, `SELECT $1::`+c.cast+`::text`, c.value).Scan(&want); err != nil {
			t.Fatalf("%s: pgx: %v", c.name, err)
		}
		if err := direct.QueryRow(ctx, `SELECT $1::`+c.cast+`::text`, c.value).Scan(&got); err != nil {
			t.Fatalf("%s: direct: %v", c.name, err)
		}
		if (want == nil) != (got == nil) || (want != nil && *want != *got) {
			t.Errorf("%s: server read %v, want %v", c.name, deref(got), deref(want))
		}
	}
	// The elements and their number, through unnest, as the ack reads them.
	var n int
	var sum int64
	if err := direct.QueryRow(ctx, `SELECT count(*), sum(x) FROM unnest($1::int8[]) x`, []int64{3, 4, 5}).Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	if n != 3 || sum != 12 {
		t.Errorf("unnest read %d elements summing to %d, want 3 and 12", n, sum)
	}
}

// TestDirectArraysScratchAcrossABatch: the statements of one batch, and
// the batches after it, share the connection's scratch buffer (each
// statement's arrays outgrow pgx's own buffer), and the server still reads
// each statement's own values: pgx copies a statement's parameters into
// its Bind message before it builds the next statement's.
func TestDirectArraysScratchAcrossABatch(t *testing.T) {
	ctx := context.Background()
	conn := connect(t)
	registerArrays(conn.TypeMap())
	const stmts, n = 5, 3000
	for round := range 3 {
		batch := &pgx.Batch{}
		want := make([][2]int64, stmts)
		for i := range stmts {
			// Sizes differ, so a statement also grows the scratch that a
			// smaller one before it left.
			size := n * (1 + (i+round)%3)
			ids := make([]int64, size)
			names := make([]string, size)
			for j := range ids {
				ids[j] = int64(round*1_000_000 + i*10_000 + j)
				names[j] = strings.Repeat("x", 1+(i+j)%7)
				want[i][0] += ids[j]
				want[i][1] += int64(len(names[j]))
			}
			batch.Queue(`SELECT (SELECT sum(x) FROM unnest($1::int8[]) x)::int8, $2::text,
				(SELECT sum(length(s)) FROM unnest($3::text[]) s)::int8`, ids, fmt.Sprint("statement ", i), names)
		}
		br := conn.SendBatch(ctx, batch)
		for i := range stmts {
			var sum, lens int64
			var label string
			if err := br.QueryRow().Scan(&sum, &label, &lens); err != nil {
				t.Fatalf("round %d statement %d: %v", round, i, err)
			}
			if sum != want[i][0] || lens != want[i][1] || label != fmt.Sprint("statement ", i) {
				t.Errorf("round %d statement %d: the server read sum %d, lengths %d, %q; want %d, %d, %q",
					round, i, sum, lens, label, want[i][0], want[i][1], fmt.Sprint("statement ", i))
			}
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func deref(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}
