package main

import (
	"bytes"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// readmeCommands parses the command table of README.md's "The `redsem`
// command" section: each command's synopsis ("status NAME") by name, and
// its own flags.
func readmeCommands(t *testing.T) (synopsis map[string]string, flags map[string][]string) {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## The `redsem` command")
	if !ok {
		t.Fatal("README.md has no section \"The `redsem` command\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	synopsis, flags = map[string]string{}, map[string][]string{}
	row := regexp.MustCompile("^\\| `([a-z-]+)((?: \\[?[A-Z]+\\]?)*)` \\|[^|]*\\|([^|]*)\\|$")
	flag := regexp.MustCompile("`--([a-z-]+)`")
	for _, line := range strings.Split(section, "\n") {
		m := row.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		synopsis[m[1]] = strings.TrimSpace(m[1] + m[2])
		flags[m[1]] = []string{}
		for _, f := range flag.FindAllStringSubmatch(m[3], -1) {
			flags[m[1]] = append(flags[m[1]], f[1])
		}
		sort.Strings(flags[m[1]])
	}
	if len(synopsis) == 0 {
		t.Fatal("README.md: no command table found")
	}
	return synopsis, flags
}

// helpFlags returns the flags that "redsem NAME --help" lists, without
// those every command takes (--redis, --prefix) and those marked
// "internal:" (bench's child-process flags), and whether the common ones
// were there.
func helpFlags(help string) (own []string, common int) {
	lines := strings.Split(help, "\n")
	def := regexp.MustCompile(`^  -([a-z-]+)`)
	for i, l := range lines {
		m := def.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		if m[1] == "redis" || m[1] == "prefix" {
			common++
			continue
		}
		if i+1 < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i+1]), "internal:") {
			continue
		}
		own = append(own, m[1])
	}
	sort.Strings(own)
	return own, common
}

// The README's command table and the commands' usage texts list exactly the
// same commands, synopses and flags.
func TestReadmeMatchesUsage(t *testing.T) {
	synopsis, flags := readmeCommands(t)
	var readme, registered []string
	for name := range synopsis {
		readme = append(readme, name)
	}
	for name := range commands {
		registered = append(registered, name)
	}
	sort.Strings(readme)
	sort.Strings(registered)
	if strings.Join(readme, " ") != strings.Join(registered, " ") {
		t.Errorf("README documents commands %v, redsem has %v", readme, registered)
	}

	var top bytes.Buffer
	run([]string{"--help"}, &top, &top)
	_, list, _ := strings.Cut(top.String(), "Commands:\n")
	list, _, _ = strings.Cut(list, "\n\n")
	var listed []string
	for _, l := range strings.Split(list, "\n") {
		if strings.HasPrefix(l, "  ") && !strings.HasPrefix(l, "   ") {
			f := strings.SplitN(strings.TrimSpace(l), "  ", 2)
			listed = append(listed, f[0])
		}
	}
	sort.Strings(listed)
	var want []string
	for _, s := range synopsis {
		want = append(want, s)
	}
	sort.Strings(want)
	if strings.Join(listed, "|") != strings.Join(want, "|") {
		t.Errorf("'redsem --help' lists %q, README %q", listed, want)
	}

	for name, syn := range synopsis {
		var out, errb bytes.Buffer
		if code := run([]string{name, "--help"}, &out, &errb); code != exitOK || errb.Len() != 0 {
			t.Errorf("redsem %s --help: exit %d, stderr %q", name, code, errb.String())
			continue
		}
		if !strings.HasPrefix(out.String(), "Usage: redsem "+syn+" ") {
			first, _, _ := strings.Cut(out.String(), "\n")
			t.Errorf("redsem %s --help begins %q, want \"Usage: redsem %s ...\" as in README", name, first, syn)
		}
		own, common := helpFlags(out.String())
		if common != 2 {
			t.Errorf("redsem %s --help: lists %d of --redis and --prefix, want both", name, common)
		}
		if strings.Join(own, " ") != strings.Join(flags[name], " ") {
			t.Errorf("redsem %s: usage lists flags %v, README %v", name, own, flags[name])
		}
	}
}
