package procenv

import (
	"slices"
	"testing"
)

func TestFilter(t *testing.T) {
	got := Filter([]string{"PATH=/usr/bin", "CHESSD_KEY_PEPPER=secret", "HOME=/root", "CHESSD_SMTP_PASSWORD=x",
		"DATABASE_URL=postgres://u:p@h/db", "PGPASSWORD=p", "PGHOST=/tmp", "CHESSD=1", "LANG=C.UTF-8"})
	want := []string{"PATH=/usr/bin", "HOME=/root", "PGHOST=/tmp", "CHESSD=1", "LANG=C.UTF-8"}
	if !slices.Equal(got, want) {
		t.Fatalf("Filter = %q, want %q", got, want)
	}
}
