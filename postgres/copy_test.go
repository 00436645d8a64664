package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/postgres"
	"chessd/postgres/pgtest"
)

// CopyRows' rows read back as PostgreSQL's own text of each value: what pgx's COPY
// would have written, value for value.
func TestCopyRows(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE copy_rows (i bigint, t text, d date, ts timestamptz, b boolean,
		n numeric, n6 numeric(20, 6), j json, z text)`); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 27, 2, 9, 13, 870756432, time.UTC) // nanoseconds: truncated to micro
	nums := []struct{ in, n, n6 string }{
		{"0", "0", "0.000000"},
		{"0.0001", "0.0001", "0.000100"},
		{"0.00010", "0.00010", "0.000100"},
		{"1", "1", "1.000000"},
		{"-5.5", "-5.5", "-5.500000"},
		{"123456.789", "123456.789", "123456.789000"},
		{"1000", "1000", "1000.000000"},
		{"500000", "500000", "500000.000000"},
		{"-0.00000001", "-0.00000001", "0.000000"},
		{"99999999.9999", "99999999.9999", "99999999.999900"},
		{"12345678901234567890123.45", "12345678901234567890123.45", ""}, // past int64, and past numeric(20, 6)
		{"1e5", "100000", "100000.000000"},
		{"0.1234", "0.1234", "0.123400"},
		{"10000.0001", "10000.0001", "10000.000100"},
	}
	w := postgres.NewCopyRows(0)
	for k, c := range nums {
		w.Row(9)
		w.Int8(int64(k) - 3)
		w.Text(fmt.Sprintf("é %d\t\\", k))
		w.Date(at.AddDate(0, 0, -k*400))
		w.Timestamptz(at.Add(time.Duration(k) * time.Hour))
		w.Bool(k%2 == 0)
		if err := w.Numeric(decimal.RequireFromString(c.in)); err != nil {
			t.Fatal(err)
		}
		if c.n6 == "" {
			w.Null()
		} else if err := w.Numeric(decimal.RequireFromString(c.in)); err != nil {
			t.Fatal(err)
		}
		w.Text(`{"k": ` + fmt.Sprint(k) + `}`)
		w.Null()
	}
	if w.Rows() != len(nums) {
		t.Fatalf("%d rows, want %d", w.Rows(), len(nums))
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	n, err := postgres.Copy(ctx, conn.Conn().PgConn(), pgx.Identifier{"copy_rows"},
		[]string{"i", "t", "d", "ts", "b", "n", "n6", "j", "z"}, w.Bytes())
	if err != nil || n != int64(len(nums)) {
		t.Fatalf("copy: %d rows, %v", n, err)
	}
	rows, err := pool.Query(ctx, `SELECT i, t, d::text, (ts AT TIME ZONE 'UTC')::text, b, n::text, coalesce(n6::text, ''), j::text, z IS NULL
		FROM copy_rows ORDER BY i`)
	if err != nil {
		t.Fatal(err)
	}
	k := 0
	for rows.Next() {
		var i int64
		var text, d, ts, num, num6, j string
		var b, null bool
		if err := rows.Scan(&i, &text, &d, &ts, &b, &num, &num6, &j, &null); err != nil {
			t.Fatal(err)
		}
		c := nums[k]
		wantTS := at.Add(time.Duration(k) * time.Hour).Truncate(time.Microsecond).Format("2006-01-02 15:04:05.999999")
		if i != int64(k)-3 || text != fmt.Sprintf("é %d\t\\", k) || d != at.AddDate(0, 0, -k*400).Format(time.DateOnly) ||
			ts != wantTS || b != (k%2 == 0) || num != c.n || num6 != c.n6 || j != `{"k": `+fmt.Sprint(k)+`}` || !null {
			t.Errorf("row %d (%s): %d %q %s %s %v %s %q %s %v; want ts %s", k, c.in, i, text, d, ts, b, num, num6, j, null, wantTS)
		}
		k++
	}
	if err := rows.Err(); err != nil || k != len(nums) {
		t.Fatalf("read %d rows: %v", k, err)
	}
}

// Values past what numeric holds are refused before their digits are spelt out (an
// exponent of a billion is a gigabyte of zeros); zero is zero at any exponent.
func TestCopyRowsNumericRange(t *testing.T) {
	w := postgres.NewCopyRows(0)
	for _, d := range []decimal.Decimal{decimal.New(1, 1_000_000_000), decimal.New(1, 131_072), decimal.New(-7, -16_384), decimal.New(0, -16_384)} {
		w.Row(1)
		if err := w.Numeric(d); err == nil {
			t.Errorf("%d × 10^%d taken", d.Coefficient(), d.Exponent())
		}
	}
	for _, d := range []decimal.Decimal{decimal.New(0, 1_000_000_000), decimal.New(1, 131_071), decimal.New(-7, -16_383)} {
		w.Row(1)
		if err := w.Numeric(d); err != nil {
			t.Errorf("%d × 10^%d: %v", d.Coefficient(), d.Exponent(), err)
		}
	}
}

// A value past the column's type modifier is refused, as any other value would be.
func TestCopyRowsRefused(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE copy_refused (n numeric(20, 6))`); err != nil {
		t.Fatal(err)
	}
	w := postgres.NewCopyRows(0)
	w.Row(1)
	if err := w.Numeric(decimal.RequireFromString("12345678901234567890123.45")); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := postgres.Copy(ctx, conn.Conn().PgConn(), pgx.Identifier{"copy_refused"}, []string{"n"}, w.Bytes()); err == nil {
		t.Fatal("a numeric past numeric(20, 6) was taken")
	}
}
