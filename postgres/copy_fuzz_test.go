package postgres

import (
	"math/big"
	"testing"
)

// FuzzNumericGroups checks the base-10,000 digits against the value they stand for:
// the digits s times 10^exp, exactly, with no leading or trailing zero group.
func FuzzNumericGroups(f *testing.F) {
	for _, seed := range []struct {
		s   string
		exp int32
	}{{"1", -4}, {"123456789", -3}, {"5", 5}, {"10", -5}, {"99999999", -4}, {"1", 0}, {"12345678901234567890123", -2}} {
		f.Add(seed.s, seed.exp)
	}
	f.Fuzz(func(t *testing.T, s string, exp int32) {
		if len(s) == 0 || len(s) > 60 || exp > 200 || exp < -200 {
			return
		}
		for _, c := range []byte(s) {
			if c < '0' || c > '9' {
				return
			}
		}
		want, _ := new(big.Rat).SetString(s)
		scale := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(abs(exp))), nil))
		if exp >= 0 {
			want.Mul(want, scale)
		} else {
			want.Quo(want, scale)
		}
		groups, weight := numericGroups([]byte(s), exp)
		got := new(big.Rat)
		base := big.NewRat(10_000, 1)
		for i, g := range groups {
			if g >= 10_000 {
				t.Fatalf("%s e%d: group %d is %d", s, exp, i, g)
			}
			p := new(big.Rat).SetInt64(1)
			for range abs(int32(weight - i)) {
				p.Mul(p, base)
			}
			if weight-i < 0 {
				p.Inv(p)
			}
			got.Add(got, p.Mul(p, big.NewRat(int64(g), 1)))
		}
		if got.Cmp(want) != 0 {
			t.Fatalf("%s e%d: groups %v weight %d make %s, want %s", s, exp, groups, weight, got.FloatString(10), want.FloatString(10))
		}
		if len(groups) > 0 && (groups[0] == 0 || groups[len(groups)-1] == 0) {
			t.Fatalf("%s e%d: groups %v keep a zero group at an end", s, exp, groups)
		}
		if want.Sign() == 0 && len(groups) != 0 {
			t.Fatalf("%s e%d: zero as %v", s, exp, groups)
		}
	})
}

func abs(n int32) int32 {
	if n < 0 {
		return -n
	}
	return n
}
