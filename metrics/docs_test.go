package metrics

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v2"
)

// ruleFile is Prometheus' rule file format, as far as we use it: strict decoding
// refuses any other key (a misspelt `annotation`, `exp`).
type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []struct {
			Record      string            `yaml:"record"`
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// ourMetrics is the name of every metric this package defines.
func ourMetrics(t *testing.T) map[string]bool {
	t.Helper()
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	out := map[string]bool{"chessd_http_request_duration_seconds": true}
	for _, d := range stateDescs {
		m := fq.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name in %s", d)
		}
		out[m[1]] = true
	}
	return out
}

// docs/prometheus-rules.yml is a well-formed Prometheus rule file (promtool is not
// installed here, so its checks that need no PromQL parser are done here): strict YAML,
// each rule a recording rule named level:metric:operations or an alert with a severity
// and a summary, and every metric an expression names is one of ours or a recorded one.
func TestPrometheusRules(t *testing.T) {
	b, err := os.ReadFile("../docs/prometheus-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("docs/prometheus-rules.yml: %v", err)
	}
	known := ourMetrics(t)
	recorded := map[string]bool{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	ident := regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	quoted := regexp.MustCompile(`"[^"]*"`)
	groups, alerts := map[string]bool{}, 0
	if len(f.Groups) == 0 {
		t.Fatal("no rule groups")
	}
	for _, g := range f.Groups {
		if g.Name == "" || groups[g.Name] || len(g.Rules) == 0 {
			t.Errorf("group %q: empty, unnamed or named twice", g.Name)
		}
		groups[g.Name] = true
		for _, r := range g.Rules {
			name := r.Record + r.Alert
			switch {
			case (r.Record == "") == (r.Alert == ""):
				t.Errorf("rule %q: exactly one of record and alert", name)
			case r.Record != "" && (!model.IsValidLegacyMetricName(r.Record) || strings.Count(r.Record, ":") < 1):
				t.Errorf("recording rule %q: not a level:metric:operations name", r.Record)
			case r.Alert != "":
				alerts++
				if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
					t.Errorf("alert %q: needs labels.severity and annotations.summary", r.Alert)
				}
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("alert %q: for %q: %v", r.Alert, r.For, err)
				}
			}
			if strings.TrimSpace(r.Expr) == "" || strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") ||
				strings.Count(r.Expr, "{") != strings.Count(r.Expr, "}") {
				t.Errorf("rule %q: expression %q is empty or unbalanced", name, r.Expr)
			}
			for _, id := range ident.FindAllString(quoted.ReplaceAllString(r.Expr, ""), -1) {
				if !strings.Contains(id, "chessd_") {
					continue
				}
				base := id
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if s, ok := strings.CutSuffix(id, suffix); ok && known[s] {
						base = s
					}
				}
				if !known[base] && !recorded[id] {
					t.Errorf("rule %q: %s is neither a metric of ours nor a recorded one", name, id)
				}
			}
		}
	}
	if alerts == 0 || len(recorded) == 0 {
		t.Errorf("%d recording rules, %d alerts", len(recorded), alerts)
	}
}

// docs/METRICS.md names every metric this package defines.
func TestMetricsDocumented(t *testing.T) {
	b, err := os.ReadFile("../docs/METRICS.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range ourMetrics(t) {
		if !strings.Contains(string(b), "`"+name+"`") {
			t.Errorf("docs/METRICS.md does not describe `%s`", name)
		}
	}
}
