package main

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestMedianInterval(t *testing.T) {
	seq := func(n int) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64(n - i) // given in reverse: the interval sorts
		}
		return xs
	}
	for _, tc := range []struct {
		n      int
		lo, hi float64 // of 1..n
		ok     bool
	}{
		{n: 5, ok: false},                 // [x1, x5] covers 93.75 %
		{n: 6, lo: 1, hi: 6, ok: true},    // 96.9 %
		{n: 7, lo: 1, hi: 7, ok: true},    // 98.4 %; [x2, x6] only 87.5 %
		{n: 9, lo: 2, hi: 8, ok: true},    // 96.1 %
		{n: 15, lo: 4, hi: 12, ok: true},  // 96.5 %; [x5, x11] 88.2 %
		{n: 41, lo: 14, hi: 28, ok: true}, // 97.1 %; [x15, x27] 93.9 %
	} {
		lo, hi, ok := medianInterval(seq(tc.n), 0.95)
		if ok != tc.ok || lo != tc.lo || hi != tc.hi {
			t.Errorf("n=%d: [%v, %v] %v, want [%v, %v] %v", tc.n, lo, hi, ok, tc.lo, tc.hi, tc.ok)
		}
	}
}

func TestBinomialCoverage(t *testing.T) {
	for _, tc := range []struct {
		n, k int
		want float64
	}{
		{5, 1, 1 - 2.0/32},
		{7, 2, 1 - 2*8.0/128},
		{15, 4, 1 - 2*(1+15+105+455)/32768.0},
	} {
		if got := binomialCoverage(tc.n, tc.k); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("coverage(%d, %d) = %v, want %v", tc.n, tc.k, got, tc.want)
		}
	}
}

func TestOrderRatios(t *testing.T) {
	p := func(raw, svc time.Duration, svcFirst bool) pair { return pair{raw: raw, svc: svc, svcFirst: svcFirst} }
	for _, tc := range []struct {
		name               string
		ps                 pairs
		rawFirst, svcFirst string
	}{
		{"none", nil, "–", "–"},
		{"raw first only", pairs{p(100, 110, false), p(100, 120, false), p(100, 130, false)}, "1.200", "–"},
		{"both orders", pairs{p(100, 104, false), p(100, 98, true), p(100, 106, false), p(100, 96, true), p(100, 102, false)}, "1.040", "0.980"},
	} {
		r, s := tc.ps.orderRatios()
		if r != tc.rawFirst || s != tc.svcFirst {
			t.Errorf("%s: %s / %s, want %s / %s", tc.name, r, s, tc.rawFirst, tc.svcFirst)
		}
	}
}

func TestPositiveInts(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []int
	}{
		{"10,14,18", []int{10, 14, 18}},
		{"1, 2", []int{1, 2}},
		{"1,2,", nil},
		{"", nil},
		{"x", nil},
		{"0", nil},
		{"-1", nil},
	} {
		got, err := positiveInts(tt.in)
		if !slices.Equal(got, tt.want) || (err == nil) != (tt.want != nil) {
			t.Errorf("positiveInts(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}
