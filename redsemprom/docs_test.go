package redsemprom_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/redsemprom"
	"go.yaml.in/yaml/v3"
)

// TestAlertRulesUseExportedMetrics keeps the alert rules of
// docs/operations.md true to this package: the YAML parses, and every
// redsem_ metric that a rule names is one that the collectors export.
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("no yaml block in docs/operations.md")
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(m[1], &rules); err != nil {
		t.Fatalf("alert rules are not valid YAML: %v", err)
	}

	// Every name the collectors export, once each has a series.
	reg := prometheus.NewRegistry()
	ms := redsemprom.New(redsemprom.Options{})
	reg.MustRegister(ms)
	for _, k := range []redsem.EventKind{redsem.EventAcquired, redsem.EventEvictionPolicy} {
		ms.Observe(redsem.Event{Kind: k, Name: "x", Policy: "allkeys-lru"})
	}
	exported := map[string]bool{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		exported[mf.GetName()] = true
	}
	for _, n := range []string{"holders", "queue_length", "limit", "up"} {
		exported["redsem_status_"+n] = true // StatusCollector, checked in TestStatusCollector
	}

	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			for _, name := range regexp.MustCompile(`redsem_[a-z_]+`).FindAllString(r.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")
				if !exported[base] {
					t.Errorf("alert %s uses %s, which redsemprom does not export", r.Alert, name)
				}
			}
		}
	}
	for _, want := range []string{"RedsemAlwaysFull", "RedsemHighTimeoutRate", "RedsemHoldersGrowing", "RedsemHoldNearTTL"} {
		if !strings.Contains(string(m[1]), "alert: "+want) {
			t.Errorf("alert %s missing", want)
		}
	}
	if n < 4 {
		t.Errorf("%d rules", n)
	}
}
