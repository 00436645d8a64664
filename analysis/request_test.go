package analysis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"chessd/domain"
	"chessd/engine"
	"chessd/postgres/pgtest"
)

// fieldsOf is the fields a validation error names; it fails t when err is not one.
func fieldsOf(t *testing.T, err error) []string {
	t.Helper()
	var de *domain.Error
	if !errors.As(err, &de) || de.Code != domain.CodeInvalid || len(de.Fields) == 0 {
		t.Fatalf("want a validation error naming its fields, got %v", err)
	}
	var out []string
	for _, f := range de.Fields {
		out = append(out, f.Field)
	}
	return out
}

// The operator's Hash cap (CHESSD_ENGINE_MAX_HASH_MB, Config.MaxHashMB) is the one
// ceiling of hash_mb: the schema GET /engines shows and the validation both take it
// from the catalog, so a request above it is a validation error naming options.hash_mb
// and never reaches an engine (which would refuse it after the price was reserved).
func TestHashCeilingIsTheCatalogs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	capped, err := engine.Open(ctx, engine.Config{PoolSize: 1, MaxHashMB: 64, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer capped.Close()
	if capped.MaxHashMB() != 64 || catalog.MaxHashMB() != 256 {
		t.Fatalf("caps: %d and %d, want 64 and the default 256", capped.MaxHashMB(), catalog.MaxHashMB())
	}
	for cat, want := range map[*engine.Catalog]int64{capped: 64, catalog: 256} {
		for _, v := range cat.Versions() {
			for _, p := range v.Paths {
				o, _ := findOption(p.Options, "Hash")
				for _, spec := range OptionSchema(cat, p) {
					if spec.Name == "hash_mb" && *spec.Max != min(want, o.Max) {
						t.Errorf("cap %d: %s %s advertises hash_mb max %d, want %d", want, v.ID, p.Path, *spec.Max, min(want, o.Max))
					}
				}
			}
		}
	}
	fen := "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
	req := Request{FEN: &fen, Depth: ptr(4), Options: &Options{HashMB: ptr(128)}}
	_, err = Validate(req, capped)
	if got := fieldsOf(t, err); len(got) != 1 || got[0] != "options.hash_mb" {
		t.Fatalf("hash_mb 128 above the cap 64: errors name %v, want options.hash_mb", got)
	}
	if _, err := Validate(req, catalog); err != nil {
		t.Fatalf("hash_mb 128 under the default cap: %v", err)
	}
	// At the cap the request is valid and the engine takes it.
	req.Options.HashMB = ptr(64)
	s, err := Validate(req, capped)
	if err != nil {
		t.Fatal(err)
	}
	svc := NewService(capped, pgtest.NewDB(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if _, err := svc.Analyse(ctx, s, engine.Interactive, false); err != nil {
		t.Fatalf("hash_mb 64 at the cap 64: %v", err)
	}
}

// An engine is an id of GET /engines or latest: "" is no id, refused under engine like
// any unknown one (as "" under path is refused under path), while an absent engine is
// the default.
func TestEmptyEngineIsRefused(t *testing.T) {
	fen := "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
	for _, tc := range []struct {
		engine, path *string
		want         string
	}{
		{ptr(""), nil, "engine"},
		{ptr(""), ptr("native"), "engine"},
		{nil, ptr(""), "path"},
	} {
		_, err := Validate(Request{FEN: &fen, Engine: tc.engine, Path: tc.path}, catalog)
		if got := fieldsOf(t, err); len(got) != 1 || got[0] != tc.want {
			t.Errorf("engine %v path %v: errors name %v, want %s", tc.engine, tc.path, got, tc.want)
		}
	}
	s, err := Validate(Request{FEN: &fen}, catalog)
	if err != nil || s.Engine != catalog.Default() {
		t.Fatalf("no engine: %q, %v; want the default %s", s.Engine, err, catalog.Default())
	}
}

// An engine refusing a search means Validate let through what the engine does not take:
// a bug of ours, not the client's. It is an internal error (500, its detail never the
// engine's words), not a 400 without an errors entry to fix; the cause stays in the chain
// for the log.
func TestEngineRefusalIsInternal(t *testing.T) {
	for _, cause := range []error{
		fmt.Errorf("%w: Hash must be in 1..64, not 128", engine.ErrInvalidOption),
		fmt.Errorf("%w: need a depth or a movetime", engine.ErrInvalidSearch),
	} {
		err := engineError(cause)
		if code := domain.ErrorCode(err); code != domain.CodeInternal || !errors.Is(err, cause) {
			t.Errorf("%v: code %s (is the cause: %v), want %s keeping the cause", cause, code, errors.Is(err, cause), domain.CodeInternal)
		}
	}
	// The same through a search: a Spec that Validate would refuse (Hash above the cap).
	svc := NewService(catalog, pgtest.NewDB(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
	fen := "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
	s := spec(t, Request{FEN: &fen, Depth: ptr(4)})
	s.UCIOptions["Hash"] = "100000"
	_, err := svc.Analyse(context.Background(), s, engine.Interactive, false)
	if code := domain.ErrorCode(err); code != domain.CodeInternal || !errors.Is(err, engine.ErrInvalidOption) {
		t.Fatalf("a search the engine refuses: %v (code %s), want %s wrapping ErrInvalidOption", err, code, domain.CodeInternal)
	}
}
