package postgres

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/shopspring/decimal"
)

// CopyRows writes rows in the binary format of COPY FROM (PostgreSQL's "COPY", File
// Formats): a rebuild's rows are written by the goroutines that decode its events,
// beside one another, where pgx's CopyFrom would encode each value on the
// connection's own path, looking up how for every one of them. Each method writes one
// field of the current row, in the table's column order, as the column's type reads
// it: Int8 for bigint, Text for text and json, and so on; a field of another type is
// refused by PostgreSQL when the rows are copied.
type CopyRows struct {
	buf  []byte
	rows int
}

// copySignature opens every binary COPY stream: the signature, no flags, no header
// extension.
var copySignature = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")

// NewCopyRows starts rows; size is a guess of the bytes they will take.
func NewCopyRows(size int) *CopyRows {
	return &CopyRows{buf: append(make([]byte, 0, len(copySignature)+size+2), copySignature...)}
}

// Row starts a row of fields fields.
func (c *CopyRows) Row(fields int) {
	c.buf = binary.BigEndian.AppendUint16(c.buf, uint16(fields))
	c.rows++
}

// Rows is how many rows were started.
func (c *CopyRows) Rows() int { return c.rows }

func (c *CopyRows) field(size int) { c.buf = binary.BigEndian.AppendUint32(c.buf, uint32(size)) }

// Null writes SQL NULL.
func (c *CopyRows) Null() { c.buf = binary.BigEndian.AppendUint32(c.buf, 0xffffffff) }

// Int8 writes a bigint.
func (c *CopyRows) Int8(v int64) {
	c.field(8)
	c.buf = binary.BigEndian.AppendUint64(c.buf, uint64(v))
}

// Int4 writes an integer.
func (c *CopyRows) Int4(v int32) {
	c.field(4)
	c.buf = binary.BigEndian.AppendUint32(c.buf, uint32(v))
}

// Bool writes a boolean.
func (c *CopyRows) Bool(v bool) {
	c.field(1)
	if v {
		c.buf = append(c.buf, 1)
	} else {
		c.buf = append(c.buf, 0)
	}
}

// Text writes a text or json value (PostgreSQL checks that it is valid UTF-8, and
// json that it is JSON).
func (c *CopyRows) Text(s string) {
	c.field(len(s))
	c.buf = append(c.buf, s...)
}

// postgresEpoch is where dates and timestamps count from.
var postgresEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Date writes the date of t's year, month and day.
func (c *CopyRows) Date(t time.Time) {
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	c.field(4)
	c.buf = binary.BigEndian.AppendUint32(c.buf, uint32(int32((day.Unix()-postgresEpoch.Unix())/86400)))
}

// Timestamptz writes t to the microsecond, truncated, as pgx does.
func (c *CopyRows) Timestamptz(t time.Time) {
	micros := t.Unix()*1_000_000 + int64(t.Nanosecond())/1000 - postgresEpoch.Unix()*1_000_000
	c.field(8)
	c.buf = binary.BigEndian.AppendUint64(c.buf, uint64(micros))
}

// Numeric writes d exactly, with as many digits after the point as d has (the
// column's type modifier rounds it, or refuses it, as it does any other value). A
// value past what PostgreSQL's numeric holds (131,072 digits before the point, 16,383
// after) is refused here, before its digits are spelt out.
func (c *CopyRows) Numeric(d decimal.Decimal) error {
	var digits [64]byte
	coef, exp := d.Coefficient(), d.Exponent()
	sign := uint16(0)
	if coef.Sign() < 0 {
		sign = 0x4000
		coef.Neg(coef)
	}
	var s []byte
	if coef.IsInt64() {
		s = strconv.AppendInt(digits[:0], coef.Int64(), 10)
	} else {
		s = coef.Append(digits[:0], 10)
	}
	dscale := max(0, -int64(exp))
	if coef.Sign() != 0 && int64(len(s))+int64(exp) > 131_072 || dscale > 16_383 {
		return fmt.Errorf("a numeric of %d digits times 10^%d is past PostgreSQL's range", len(s), exp)
	}
	var groups []uint16
	weight := 0
	if coef.Sign() != 0 {
		groups, weight = numericGroups(s, exp)
	}
	c.field(8 + 2*len(groups))
	for _, v := range []uint16{uint16(len(groups)), uint16(int16(weight)), sign, uint16(dscale)} {
		c.buf = binary.BigEndian.AppendUint16(c.buf, v)
	}
	for _, g := range groups {
		c.buf = binary.BigEndian.AppendUint16(c.buf, g)
	}
	return nil
}

// numericGroups turns the decimal digits s times 10^exp into base-10,000 digits
// aligned on the point, the first worth 10,000^weight, without leading or trailing
// zero groups (none at all for zero).
func numericGroups(s []byte, exp int32) (groups []uint16, weight int) {
	var intLen, fracLen int
	if exp >= 0 {
		s = append(s, strings.Repeat("0", int(exp))...)
		intLen = len(s)
	} else {
		fracLen = int(-exp)
		if len(s) < fracLen {
			s = append([]byte(strings.Repeat("0", fracLen-len(s))), s...)
		}
		intLen = len(s) - fracLen
	}
	padLeft, padRight := (4-intLen%4)%4, (4-fracLen%4)%4
	full := make([]byte, 0, padLeft+len(s)+padRight)
	full = append(append(append(full, strings.Repeat("0", padLeft)...), s...), strings.Repeat("0", padRight)...)
	weight = (intLen+padLeft)/4 - 1
	for i := 0; i < len(full); i += 4 {
		g := uint16(0)
		for _, b := range full[i : i+4] {
			g = 10*g + uint16(b-'0')
		}
		groups = append(groups, g)
	}
	for len(groups) > 0 && groups[0] == 0 {
		groups, weight = groups[1:], weight-1
	}
	for len(groups) > 0 && groups[len(groups)-1] == 0 {
		groups = groups[:len(groups)-1]
	}
	return groups, weight
}

// Bytes ends the rows and returns them, ready for Copy.
func (c *CopyRows) Bytes() []byte {
	return binary.BigEndian.AppendUint16(c.buf, 0xffff)
}

// Copy loads rows written by CopyRows into table's columns, on conn (a transaction's
// connection: tx.Conn().PgConn()). It returns how many rows PostgreSQL took.
func Copy(ctx context.Context, conn *pgconn.PgConn, table pgx.Identifier, columns []string, rows []byte) (int64, error) {
	cols := make([]string, len(columns))
	for i, col := range columns {
		cols[i] = pgx.Identifier{col}.Sanitize()
	}
	tag, err := conn.CopyFrom(ctx, bytes.NewReader(rows),
		fmt.Sprintf("COPY %s (%s) FROM STDIN (FORMAT binary)", table.Sanitize(), strings.Join(cols, ", ")))
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
