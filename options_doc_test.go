package redsem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// Every field of Options and FamilyOptions, in both variants, has a doc
// comment that starts with its name (the one place that states what it
// does and its default). The two variants' files are generated from one
// template (internal/variantgen), so a doc that both share is written
// once; where they differ, the template holds each variant's text.
func TestOptionsDocumented(t *testing.T) {
	for _, c := range []struct{ path, name string }{
		{"fair/semaphore.go", "Options"},
		{"unfair/semaphore.go", "Options"},
		{"fair/family.go", "FamilyOptions"},
		{"unfair/family.go", "FamilyOptions"},
	} {
		docs := fieldDocs(t, c.path, c.name)
		if len(docs) < 3 {
			t.Fatalf("%s: only %d named fields found in %s: is the parse right?", c.path, len(docs), c.name)
		}
		for field, doc := range docs {
			if !strings.HasPrefix(doc, field+" ") && !strings.HasPrefix(doc, field+",") {
				t.Errorf("%s: %s.%s has no doc comment that starts with its name: %q", c.path, c.name, field, doc)
			}
		}
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
