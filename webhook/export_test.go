package webhook

import "time"

// SetExpireBatch makes Expire delete in batches of n rows until the test ends.
func SetExpireBatch(t interface{ Cleanup(func()) }, n int) {
	old := expireBatch
	expireBatch = n
	t.Cleanup(func() { expireBatch = old })
}

// ExpireStatements are Expire's statements and their arguments for age.
func ExpireStatements(age time.Duration) ([]string, []any) {
	return []string{expireSQL, expireEndpointsSQL}, []any{expireBatch, age.Seconds()}
}
