// Package analysis turns an evaluation request into an answer: it validates the
// request against the chosen engine's own option ranges, answers finished positions
// without an engine, serves the eval cache, drives the engine pools, and converts what
// the engine says (side to move, UCI) into what clients get (White's view, UCI and SAN).
package analysis

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"chessd/domain"
	"chessd/domain/position"
	"chessd/engine"
)

// Request is the body of POST /eval and POST /bestmove (EvalRequest). Pointers tell
// "absent" from zero.
type Request struct {
	FEN        *string  `json:"fen"`
	Depth      *int     `json:"depth"`
	MultiPV    *int     `json:"multipv"`
	MoveTimeMS *int     `json:"movetime_ms"`
	Engine     *string  `json:"engine"`
	Path       *string  `json:"path"`
	Options    *Options `json:"options"`
}

// Options are the engine options a request may set, by their JSON names.
type Options struct {
	HashMB         *int  `json:"hash_mb"`
	LimitStrength  *bool `json:"limit_strength"`
	Elo            *int  `json:"elo"`
	SkillLevel     *int  `json:"skill_level"`
	Chess960       *bool `json:"chess960"`
	ShowWDL        *bool `json:"show_wdl"`
	MoveOverheadMS *int  `json:"move_overhead_ms"`
}

// Bounds of EvalRequest (service-spec.md, Limits).
const (
	DefaultDepth = 14
	MaxDepth     = 30
	MaxMultiPV   = 10
	MinMoveTime  = 50
	MaxMoveTime  = 60000
	// SearchCap bounds every search, also depth-only ones: a depth-30 search stops
	// here with the depth it reached.
	SearchCap = MaxMoveTime * time.Millisecond
)

// Spec is a validated request with every default applied.
type Spec struct {
	FEN           string
	Depth         int
	MultiPV       int
	MoveTimeMS    int // 0: none
	Engine        string
	Path          engine.Path
	Chess960      bool
	ShowWDL       bool
	LimitStrength bool              // limited results are never cached
	UCIOptions    map[string]string // the request's options as UCI name -> value
	// Stored says FEN was accepted and stored before (a job's position): it is read
	// with position.ParseStored, which repairs counters an earlier release let through
	// beside an en passant square, and the result gives the FEN as repaired. A
	// request's own FEN is never Stored.
	Stored bool
}

// optionDef maps a JSON option to its UCI option, with the service's own ceiling.
type optionDef struct {
	JSON, UCI, Type string
	// ceiling is the service's cap below the engine's own max, for a catalog; nil or
	// <=0: the engine's own max.
	ceiling func(*engine.Catalog) int64
	get     func(*Options) (any, bool)
}

// policy is a fixed ceiling of the service's.
func policy(n int64) func(*engine.Catalog) int64 {
	return func(*engine.Catalog) int64 { return n }
}

// hashCeiling is the Hash cap the catalog's pools enforce (the operator's
// CHESSD_ENGINE_MAX_HASH_MB): the schema and the validation take it from there, so a
// request above it is refused here, naming options.hash_mb, before anything is
// reserved or any engine taken, and never by the engine after.
func hashCeiling(cat *engine.Catalog) int64 { return int64(cat.MaxHashMB()) }

var optionDefs = []optionDef{
	{"hash_mb", "Hash", "integer", hashCeiling, func(o *Options) (any, bool) { return o.HashMB, o.HashMB != nil }},
	{"limit_strength", "UCI_LimitStrength", "boolean", nil, func(o *Options) (any, bool) { return o.LimitStrength, o.LimitStrength != nil }},
	{"elo", "UCI_Elo", "integer", nil, func(o *Options) (any, bool) { return o.Elo, o.Elo != nil }},
	{"skill_level", "Skill Level", "integer", nil, func(o *Options) (any, bool) { return o.SkillLevel, o.SkillLevel != nil }},
	{"chess960", "UCI_Chess960", "boolean", nil, func(o *Options) (any, bool) { return o.Chess960, o.Chess960 != nil }},
	{"show_wdl", "UCI_ShowWDL", "boolean", nil, func(o *Options) (any, bool) { return o.ShowWDL, o.ShowWDL != nil }},
	{"move_overhead_ms", "Move Overhead", "integer", policy(5000), func(o *Options) (any, bool) { return o.MoveOverheadMS, o.MoveOverheadMS != nil }},
}

// OptionSpec describes one request option for GET /engines.
type OptionSpec struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Default any    `json:"default"`
	Min     *int64 `json:"min,omitempty"`
	Max     *int64 `json:"max,omitempty"`
	UCI     string `json:"uci_option"`
}

// OptionSchema derives the request options of one build of cat's from its own `uci`
// option list, clipped by the service's policy and cat's configuration (the Hash cap).
// Options the build lacks are left out.
func OptionSchema(cat *engine.Catalog, p engine.PathInfo) []OptionSpec {
	var out []OptionSpec
	for _, d := range optionDefs {
		o, ok := findOption(p.Options, d.UCI)
		if !ok {
			continue
		}
		spec := OptionSpec{Name: d.JSON, Type: d.Type, UCI: d.UCI}
		switch d.Type {
		case "boolean":
			spec.Default = o.Default == "true"
		default:
			lo, hi := o.Min, o.Max
			if d.ceiling != nil {
				if c := d.ceiling(cat); c > 0 && hi > c {
					hi = c
				}
			}
			def, _ := strconv.ParseInt(o.Default, 10, 64)
			spec.Default, spec.Min, spec.Max = min(def, hi), &lo, &hi
		}
		out = append(out, spec)
	}
	return out
}

func findOption(opts []engine.Option, name string) (engine.Option, bool) {
	for _, o := range opts {
		if o.Name == name {
			return o, true
		}
	}
	return engine.Option{}, false
}

// Validate checks a request against the catalog and the chosen engine's options,
// reporting every bad field at once, and applies the defaults. The FEN of a valid
// request is read later, once (Service.Lookup, which remembers it); when another field
// is bad, it is read here too, so that the refusal names it as well.
func Validate(req Request, cat *engine.Catalog) (Spec, error) {
	var p domain.Problems
	s := Spec{Depth: DefaultDepth, MultiPV: 1, Engine: engine.Latest, Path: engine.PathAuto, UCIOptions: map[string]string{}}
	if req.FEN == nil {
		p.Add("fen", "is required")
	} else {
		s.FEN = *req.FEN
	}
	if req.Depth != nil {
		if *req.Depth < 1 || *req.Depth > MaxDepth {
			p.Add("depth", fmt.Sprintf("must be from 1 to %d", MaxDepth))
		}
		s.Depth = *req.Depth
	}
	if req.MultiPV != nil {
		if *req.MultiPV < 1 || *req.MultiPV > MaxMultiPV {
			p.Add("multipv", fmt.Sprintf("must be from 1 to %d", MaxMultiPV))
		}
		s.MultiPV = *req.MultiPV
	}
	if req.MoveTimeMS != nil {
		if *req.MoveTimeMS < MinMoveTime || *req.MoveTimeMS > MaxMoveTime {
			p.Add("movetime_ms", fmt.Sprintf("must be from %d to %d", MinMoveTime, MaxMoveTime))
		}
		s.MoveTimeMS = *req.MoveTimeMS
	}
	if id, path, ok := ResolveEngine(&p, cat, req.Engine, req.Path); ok {
		s.Engine, s.Path = id, path
		if req.Options != nil {
			validateOptions(&p, &s, req.Options, cat)
		}
	}
	if len(p) > 0 {
		p = FENProblem(p, req)
	}
	return s, p.Err()
}

// FENProblem is p with the request's FEN's problem first, if it has one that p does not
// name already: a refused request's FEN is read only to be named with its other
// problems (a valid request's is read by Service.Lookup). The FEN is read as the
// request's options say (chess960), whether or not they are valid.
func FENProblem(p domain.Problems, req Request) domain.Problems {
	if req.FEN == nil || slices.ContainsFunc(p, func(f domain.FieldError) bool { return f.Field == "fen" }) {
		return p
	}
	chess960 := req.Options != nil && req.Options.Chess960 != nil && *req.Options.Chess960
	var pe *position.Error
	if _, err := position.Parse(*req.FEN, chess960); errors.As(err, &pe) {
		return append(domain.Problems{{Field: "fen", Reason: pe.Reason}}, p...)
	}
	return p
}

// ResolveEngine resolves the engine version and path a request names (nil: the latest,
// auto). Each mistake is reported under its own field: an engine that is not installed
// (or "", which is no id: the catalog would read it as latest) under "engine", a path
// that is not auto, native or wasm, or that the engine lacks, under "path".
func ResolveEngine(p *domain.Problems, cat *engine.Catalog, version, path *string) (string, engine.Path, bool) {
	v, want := engine.Latest, engine.PathAuto
	if version != nil {
		v = *version
	}
	ok := true
	if path != nil {
		switch want = engine.Path(*path); want {
		case engine.PathAuto, engine.PathNative, engine.PathWasm:
		default:
			p.Add("path", "must be auto, native or wasm")
			ok = false
		}
	}
	if _, _, err := cat.Resolve(v, engine.PathAuto); err != nil || v == "" {
		p.Add("engine", fmt.Sprintf("unknown engine %s (see GET /v1/engines)", clip(v)))
		return "", "", false
	}
	if !ok {
		return "", "", false
	}
	id, resolved, err := cat.Resolve(v, want)
	if err != nil {
		p.Add("path", fmt.Sprintf("%s has no %s path installed (see GET /v1/engines)", clip(v), want))
		return "", "", false
	}
	return id, resolved, true
}

// clip quotes a client's string for a message, cut to a readable length.
func clip(s string) string {
	if r := []rune(s); len(r) > 40 {
		s = string(r[:40]) + "…"
	}
	return strconv.Quote(s)
}

func validateOptions(p *domain.Problems, s *Spec, o *Options, cat *engine.Catalog) {
	info, _ := pathInfo(cat, s.Engine, s.Path)
	schema := map[string]OptionSpec{}
	for _, spec := range OptionSchema(cat, info) {
		schema[spec.Name] = spec
	}
	for _, d := range optionDefs {
		v, set := d.get(o)
		if !set {
			continue
		}
		spec, ok := schema[d.JSON]
		if !ok {
			p.Add("options."+d.JSON, fmt.Sprintf("is not supported by %s (%s)", s.Engine, s.Path))
			continue
		}
		switch v := v.(type) {
		case *bool:
			s.UCIOptions[d.UCI] = strconv.FormatBool(*v)
		case *int:
			if int64(*v) < *spec.Min || int64(*v) > *spec.Max {
				p.Add("options."+d.JSON, fmt.Sprintf("must be from %d to %d for %s", *spec.Min, *spec.Max, s.Engine))
				continue
			}
			s.UCIOptions[d.UCI] = strconv.Itoa(*v)
		}
	}
	if o.Chess960 != nil {
		s.Chess960 = *o.Chess960
	}
	if o.ShowWDL != nil {
		s.ShowWDL = *o.ShowWDL
	}
	// An Elo only means something at limited strength: asking for one implies it, and
	// asking for one while turning limited strength off is contradictory.
	if o.Elo != nil {
		if o.LimitStrength != nil && !*o.LimitStrength {
			p.Add("options.elo", "needs limit_strength true (or leave limit_strength out)")
		}
		s.UCIOptions["UCI_LimitStrength"] = "true"
	}
	s.LimitStrength = s.UCIOptions["UCI_LimitStrength"] == "true" ||
		(o.SkillLevel != nil && int64(*o.SkillLevel) < maxOf(schema["skill_level"]))
}

func maxOf(spec OptionSpec) int64 {
	if spec.Max == nil {
		return 0
	}
	return *spec.Max
}

// pathInfo finds the description of one installed (version, path).
func pathInfo(cat *engine.Catalog, id string, path engine.Path) (engine.PathInfo, bool) {
	for _, v := range cat.Versions() {
		if v.ID != id {
			continue
		}
		for _, pi := range v.Paths {
			if pi.Path == path {
				return pi, true
			}
		}
	}
	return engine.PathInfo{}, false
}
