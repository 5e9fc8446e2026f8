package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The generated files of fair and unfair are what the generator writes
// from the templates now, byte for byte: a template edited without go
// generate, or a generated file edited by hand, fails here. Each
// package's doc.go holds the go:generate line that writes them.
func TestVariantsGenerated(t *testing.T) {
	for _, v := range variants {
		dir := t.TempDir()
		if err := write(dir, v.Package); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			got, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				t.Fatal(err)
			}
			committed := filepath.Join("..", "..", v.Package, f)
			want, err := os.ReadFile(committed)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s/%s differs from what internal/variantgen writes (line %d): edit %s.tmpl, not the file, and run go generate ./fair ./unfair",
					v.Package, f, firstDiff(got, want), f)
			}
		}
		doc, err := os.ReadFile(filepath.Join("..", "..", v.Package, "doc.go"))
		if err != nil {
			t.Fatal(err)
		}
		if line := "//go:generate go run ../internal/variantgen " + v.Package + "\n"; !bytes.Contains(doc, []byte(line)) {
			t.Errorf("%s/doc.go has no line %q", v.Package, strings.TrimSpace(line))
		}
	}
}

// firstDiff is the number of the first line where a and b differ.
func firstDiff(a, b []byte) int {
	la, lb := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	for i := range min(len(la), len(lb)) {
		if !bytes.Equal(la[i], lb[i]) {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}

// The generated files start with the header that marks them generated
// (go.dev/s/generatedcode), and an unknown variant writes nothing.
func TestGenerateHeader(t *testing.T) {
	for _, v := range variants {
		out, err := generate(v.Package)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			first, _, _ := strings.Cut(string(out[f]), "\n")
			if !strings.HasPrefix(first, "// Code generated ") || !strings.HasSuffix(first, " DO NOT EDIT.") {
				t.Errorf("%s/%s starts with %q", v.Package, f, first)
			}
		}
	}
	if _, err := generate("fifo"); err == nil {
		t.Error("generate(fifo): no error")
	}
}

// checkConfig refuses a config method that leaves out a field of Options
// or reads one twice, and accepts one that reads each once.
func TestCheckConfig(t *testing.T) {
	const head = `package p

type Options struct {
	A int
	// B is documented.
	B, C string
}

`
	for body, ok := range map[string]bool{
		`func (o Options) config() core.Config { return core.Config{A: o.A, B: o.B, C: o.C} }`: true,
		`func (o Options) config() core.Config { return core.Config{A: o.A, B: o.B} }`:         false,
		`func (o Options) config() core.Config { return core.Config{A: o.A, B: o.B, C: o.B} }`: false,
		`func (o *Other) config() core.Config { return core.Config{A: o.A, B: o.B, C: o.C} }`:  false,
	} {
		err := checkConfig([]byte(head + body))
		if (err == nil) != ok {
			t.Errorf("%s: error %v", body, err)
		}
	}
}
