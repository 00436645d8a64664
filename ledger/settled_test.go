package ledger_test

import (
	"strconv"
	"strings"
	"testing"

	"chessd/ledger"
)

// A line's charge id has one spelling: LineChargeID gives what ParseLineChargeID reads
// back, and a UnitsCharged's random id, or anything else a client sends, is not a
// line's.
func TestLineChargeID(t *testing.T) {
	for _, c := range []struct {
		pos  int64
		line int
	}{{1, 0}, {42, 7}, {1 << 40, 511}} {
		id := ledger.LineChargeID(c.pos, c.line)
		if pos, line, ok := ledger.ParseLineChargeID(id); !ok || pos != c.pos || line != c.line {
			t.Errorf("ParseLineChargeID(%q) = %d, %d, %v", id, pos, line, ok)
		}
	}
	for _, bad := range []string{"", "chg_", "chg_1", "chg_1_", "chg__1", "chg_0_0", "chg_-1_0", "chg_1_-1", "chg_01_0",
		"chg_1_00", "chg_1_512", "chg_1_0_0", "chg_+1_0", "chg_1_+0", "CHG_1_0", "chg_9223372036854775808_0",
		"chg_5f0c1e2d3c4b5a6978877665", "chg_1 _0"} {
		if pos, line, ok := ledger.ParseLineChargeID(bad); ok {
			t.Errorf("ParseLineChargeID(%q) = %d, %d: not a line's id", bad, pos, line)
		}
	}
}

// FuzzParseLineChargeID: whatever a client names a charge by (a dispute's charge_ids,
// GET /charges/{id}) is a line's id only when it is exactly the id of that line.
func FuzzParseLineChargeID(f *testing.F) {
	for _, s := range []string{"chg_1_0", "chg_9223372036854775807_511", "chg_01_0", "chg_1_512", "chg_5f0c1e2d3c4b5a6978877665", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pos, line, ok := ledger.ParseLineChargeID(s)
		if !ok {
			return
		}
		if pos <= 0 || line < 0 || line >= 512 || ledger.LineChargeID(pos, line) != s ||
			s != "chg_"+strconv.FormatInt(pos, 10)+"_"+strings.TrimPrefix(strconv.Itoa(line), "+") {
			t.Fatalf("ParseLineChargeID(%q) = %d, %d", s, pos, line)
		}
	})
}
