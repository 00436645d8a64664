package eventstore

import (
	"context"
	"strings"
	"testing"
)

// rehash recomputes every hash from position from on, and the head, as someone who can
// write the database would after editing the log: the chain then checks out.
func rehash(t *testing.T, s *Store, from int64) {
	t.Helper()
	ctx := context.Background()
	evs, err := ReadFrom(ctx, s.Pool(), 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var prev []byte
	for i := range evs {
		e := &evs[i]
		if e.Position >= from {
			e.Hash = ChainHash(prev, e)
			if _, err := s.Pool().Exec(ctx, `UPDATE events SET hash = $1 WHERE position = $2`, e.Hash, e.Position); err != nil {
				t.Fatal(err)
			}
		}
		prev = e.Hash
	}
	last := evs[len(evs)-1]
	if _, err := s.Pool().Exec(ctx, `UPDATE event_chain SET position = $1, hash = $2`, last.Position, last.Hash); err != nil {
		t.Fatal(err)
	}
}

// A rewrite that recomputes the hashes and moves the head along passes Verify on the
// database alone, as documented; an anchor taken before it catches it, and an anchor
// past a truncated log's end catches the truncation.
func TestVerifyAnchors(t *testing.T) {
	cases := []struct {
		name   string
		tamper func(t *testing.T, s *Store)
		pos    int64
		kind   string
	}{
		{"intact", func(*testing.T, *Store) {}, 0, ""},
		{"rewritten from 3", func(t *testing.T, s *Store) {
			if _, err := s.Pool().Exec(context.Background(), `UPDATE events SET payload = '{"n":999}' WHERE position = 3`); err != nil {
				t.Fatal(err)
			}
			rehash(t, s, 3)
		}, 6, "rewritten"},
		{"truncated after 4", func(t *testing.T, s *Store) {
			if _, err := s.Pool().Exec(context.Background(), `DELETE FROM events WHERE position > 4`); err != nil {
				t.Fatal(err)
			}
			rehash(t, s, 5)
		}, 5, "deleted"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := newStore(t)
			for i := range 6 {
				if err := appendOne(ctx, s, []string{"p", "q"}[i%2], int64(i/2), i); err != nil {
					t.Fatal(err)
				}
			}
			before, err := Verify(ctx, s.Pool())
			if err != nil || before.Tamper != nil || before.Anchor.Position != 6 {
				t.Fatalf("before: %+v %v", before, err)
			}
			anchor, err := ParseAnchor(before.Anchor.String()) // as kept outside, in writing
			if err != nil {
				t.Fatal(err)
			}
			tc.tamper(t, s)
			if rep, err := Verify(ctx, s.Pool()); err != nil || rep.Tamper != nil {
				t.Fatalf("without the anchor: %+v %v, want intact (the documented limit)", rep, err)
			}
			rep, err := Verify(ctx, s.Pool(), anchor)
			if err != nil {
				t.Fatal(err)
			}
			if tc.kind == "" {
				if rep.Tamper != nil || rep.Anchor.String() != anchor.String() {
					t.Fatalf("intact: %+v", rep)
				}
				// two anchors at one position that disagree cannot both hold
				other := Anchor{Position: anchor.Position, Hash: make([]byte, len(anchor.Hash))}
				for _, two := range [][]Anchor{{other, anchor}, {anchor, other}} {
					if rep, err := Verify(ctx, s.Pool(), two...); err != nil || rep.Tamper == nil || rep.Tamper.Kind != "rewritten" {
						t.Fatalf("with a wrong anchor beside the right one: %+v %v", rep, err)
					}
				}
				return
			}
			if rep.Tamper == nil || rep.Tamper.Position != tc.pos || rep.Tamper.Kind != tc.kind {
				t.Fatalf("with the anchor: %v, want position %d %s", rep.Tamper, tc.pos, tc.kind)
			}
		})
	}
}

func TestParseAnchor(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"12:" + hash, true},
		{" 12:" + hash + "\n", true},
		{"0:" + hash, false},
		{"-1:" + hash, false},
		{"12:" + hash[:62], false},
		{"12:" + hash + "00", false},
		{"12:" + strings.Repeat("zz", 32), false},
		{"12" + hash, false},
		{"", false},
	} {
		a, err := ParseAnchor(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseAnchor(%q): %v, want ok %v", tc.in, err, tc.ok)
		}
		if err == nil && a.String() != strings.TrimSpace(tc.in) {
			t.Errorf("ParseAnchor(%q) writes back as %q", tc.in, a)
		}
	}
}

// Whatever reads as an anchor writes back as the same text; nothing panics.
func FuzzParseAnchor(f *testing.F) {
	f.Add("12:" + strings.Repeat("ab", 32))
	f.Add("9223372036854775807:" + strings.Repeat("00", 32))
	f.Add("1:")
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAnchor(s)
		if err != nil {
			return
		}
		if b, err := ParseAnchor(a.String()); err != nil || b.String() != a.String() {
			t.Fatalf("%q reads as %v, which reads back as %v (%v)", s, a, b, err)
		}
	})
}
