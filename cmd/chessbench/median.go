package main

import (
	"fmt"
	"math"
	"sort"
)

// medianInterval is a confidence interval for the median of the population xs were
// drawn from, of at least the given level (0.95): the order statistics x(k) and
// x(n+1-k), 1-based, with k the largest such that at least level of the binomial
// Bin(n, 1/2) lies in [k, n-k]. It assumes nothing of the distribution, only that
// the samples are independent; the pairs of a row are (each pair runs both sides
// back to back, and the machine's speed moves between pairs). ok is false when n is
// too small for the level (5 samples reach only 93.75 %).
func medianInterval(xs []float64, level float64) (lo, hi float64, ok bool) {
	n := len(xs)
	k := 0
	for c := 1; c <= n/2; c++ {
		if binomialCoverage(n, c) < level {
			break
		}
		k = c
	}
	if k == 0 {
		return 0, 0, false
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[k-1], s[n-k], true
}

// binomialCoverage is P(k ≤ X ≤ n−k) for X ~ Bin(n, 1/2): the chance that the median
// lies between the k-th smallest and the k-th largest of n samples.
func binomialCoverage(n, k int) float64 {
	tail := 0.0 // P(X ≤ k−1)
	for i := range k {
		tail += math.Exp(logChoose(n, i) - float64(n)*math.Ln2)
	}
	return 1 - 2*tail
}

func logChoose(n, k int) float64 {
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}

// interval is " [lo, hi]", the 95 % interval of xs' median in format, or "" when there
// are too few samples for one.
func interval(xs []float64, format string) string {
	lo, hi, ok := medianInterval(xs, 0.95)
	if !ok {
		return ""
	}
	return fmt.Sprintf(" ["+format+", "+format+"]", lo, hi)
}
