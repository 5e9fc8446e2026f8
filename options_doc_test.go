package redsem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"strings"
	"testing"
)

// The options both variants share are documented once in meaning: a field
// that fair.Options and unfair.Options both have carries the same doc
// comment in each, except where the variants behave differently, listed
// here with the reason. A doc edited in one file only fails this test.
func TestSharedOptionDocsAgree(t *testing.T) {
	differ := map[string]string{
		"DisableAutoRenew": "fair adds how a grant from the queue lasts until its first renewal",
		"FallbackInterval": "fair's waiters rely on their session; unfair's retry on their own",
		"Rate":             "fair's head waits for both bounds and is never overtaken; unfair grants whoever fits",
	}
	fair := fieldDocs(t, "fair/fair.go", "Options")
	unfair := fieldDocs(t, "unfair/unfair.go", "Options")
	shared := 0
	for name, doc := range unfair {
		fdoc, ok := fair[name]
		if !ok {
			t.Errorf("unfair.Options.%s has no counterpart in fair.Options", name)
			continue
		}
		shared++
		if _, ok := differ[name]; ok {
			if fdoc == doc {
				t.Errorf("Options.%s: the docs are the same now; drop it from the exceptions", name)
			}
			continue
		}
		if fdoc != doc {
			t.Errorf("Options.%s documented differently:\nfair:   %s\nunfair: %s", name, fdoc, doc)
		}
	}
	for name := range differ {
		if _, ok := unfair[name]; !ok {
			t.Errorf("exception %s names no shared field", name)
		}
	}
	if shared < 8 {
		t.Fatalf("only %d shared fields found: is the parse right?", shared)
	}
}

// The fields FamilyOptions adds to Options are documented the same in
// both variants.
func TestFamilyOptionDocsAgree(t *testing.T) {
	fair := fieldDocs(t, "fair/family.go", "FamilyOptions")
	unfair := fieldDocs(t, "unfair/family.go", "FamilyOptions")
	if !maps.Equal(fair, unfair) {
		t.Errorf("FamilyOptions documented differently:\nfair:   %q\nunfair: %q", fair, unfair)
	}
	if len(fair) < 2 {
		t.Fatalf("only %d named fields found in FamilyOptions: is the parse right?", len(fair))
	}
}

// fieldDocs returns the doc comments of the named fields of the struct
// type called name in the file at path.
func fieldDocs(t *testing.T, path, name string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != name {
			return true
		}
		for _, field := range ts.Type.(*ast.StructType).Fields.List {
			for _, id := range field.Names {
				docs[id.Name] = strings.TrimSpace(field.Doc.Text())
			}
		}
		return false
	})
	if len(docs) == 0 {
		t.Fatalf("%s: no struct %s", path, name)
	}
	return docs
}
