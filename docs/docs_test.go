// Package docs holds Bulkhead's documentation. Its tests keep one promise:
// every shell block of the README and of docs/*.md either runs as pasted or
// says why it cannot, and what to substitute.
//
// Every fenced block names its language (```text for output). Every shell
// block (sh, bash, shell, console) carries a marker on the line before its
// opening fence (blank lines may come between):
//
//	<!-- test: run -->                       runs; must exit 0
//	<!-- test: run exit=3 -->                runs; must exit 3 (a refusal, say)
//	<!-- test: skip reason="needs a node" --> not run; the text above it says
//	                                          what to substitute
//
// A run block runs with `bash -eu -o pipefail` in a scratch directory holding
// a copy of what a fresh clone has that the docs use (rego/, deploy/, the
// Makefile, go.mod, test/scripts, test/cluster/tools) and the repository's
// bin/ (`make build`), with neither bin/ nor the tools directory on PATH: a
// block that needs them says so itself. In a console block the lines starting with "$ " are
// commands and the lines after each are its output, which must come out
// byte for byte. A skipped block is still checked: it must parse as shell,
// and every `bulkhead` command in it must exist with the flags it uses.
package docs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// shellLangs are the info strings of blocks a reader pastes into a shell.
var shellLangs = []string{"sh", "bash", "shell", "console"}

// block is one fenced block of a Markdown file.
type block struct {
	file string // base name
	line int    // line of the opening fence
	lang string // the info string's first word
	text string // content, dedented to the fence's indentation
	mark *mark  // nil when no marker precedes it
}

// mark is a block's test marker.
type mark struct {
	run    bool
	exit   int    // expected exit status of a run block
	reason string // why a skipped block cannot run
}

func (b block) shell() bool { return slices.Contains(shellLangs, b.lang) }

func (b block) String() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

var (
	markerLine = regexp.MustCompile(`^<!--\s*test:`)
	markerFull = regexp.MustCompile(`^<!-- test: (run|skip)((?: [a-z]+=(?:"[^"]*"|[^ "]+))*) -->$`)
	markerAttr = regexp.MustCompile(`([a-z]+)=("[^"]*"|[^ "]+)`)
)

func parseMark(s string) (*mark, error) {
	m := markerFull.FindStringSubmatch(s)
	if m == nil {
		return nil, fmt.Errorf("marker %q: want <!-- test: run -->, <!-- test: run exit=N --> or <!-- test: skip reason=\"...\" -->", s)
	}
	mk := &mark{run: m[1] == "run"}
	for _, a := range markerAttr.FindAllStringSubmatch(m[2], -1) {
		key, val := a[1], strings.Trim(a[2], `"`)
		switch {
		case key == "exit" && mk.run:
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 || n > 255 {
				return nil, fmt.Errorf("marker %q: exit=%s is not an exit status (0-255)", s, val)
			}
			mk.exit = n
		case key == "reason" && !mk.run:
			mk.reason = strings.TrimSpace(val)
		default:
			return nil, fmt.Errorf("marker %q: %s= does not go with %s", s, key, m[1])
		}
	}
	if !mk.run && mk.reason == "" {
		return nil, fmt.Errorf("marker %q: a skipped block says why: reason=\"...\"", s)
	}
	return mk, nil
}

// parseBlocks returns every fenced block of a Markdown document and refuses
// what would let a shell block go unchecked: a fence without a language, a
// shell block without a marker, a marker before anything but a shell block.
func parseBlocks(name string, doc []byte) ([]block, error) {
	var out []block
	var errs []error
	var cur *block
	var pending *mark
	pendingLine := 0
	indent := ""
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(doc))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
		l := sc.Text()
		t := strings.TrimSpace(l)
		if cur != nil {
			if t == "```" {
				out = append(out, *cur)
				cur = nil
				continue
			}
			cur.text += strings.TrimPrefix(l, indent) + "\n"
			continue
		}
		switch {
		case strings.HasPrefix(t, "```"):
			indent = l[:len(l)-len(strings.TrimLeft(l, " \t"))]
			lang, _, _ := strings.Cut(strings.TrimPrefix(t, "```"), " ")
			cur = &block{file: name, line: n, lang: lang, mark: pending}
			switch {
			case lang == "":
				errs = append(errs, fmt.Errorf("%s:%d: a fence names its language (```text for output, ```sh for commands)", name, n))
			case cur.shell() && pending == nil:
				errs = append(errs, fmt.Errorf("%s:%d: ```%s block without a marker: <!-- test: run --> or <!-- test: skip reason=\"...\" --> on the line before (docs/docs_test.go)", name, n, lang))
			case !cur.shell() && pending != nil:
				errs = append(errs, fmt.Errorf("%s:%d: test marker before a ```%s block: only shell blocks (%s) run", name, pendingLine, lang, strings.Join(shellLangs, ", ")))
			}
			pending = nil
		case markerLine.MatchString(t):
			if pending != nil {
				errs = append(errs, fmt.Errorf("%s:%d: marker not followed by a block", name, pendingLine))
			}
			mk, err := parseMark(t)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: %w", name, n, err))
				mk = &mark{reason: "bad marker"}
			}
			pending, pendingLine = mk, n
		case t != "" && pending != nil:
			errs = append(errs, fmt.Errorf("%s:%d: marker not followed by a block", name, pendingLine))
			pending = nil
		}
	}
	if cur != nil {
		errs = append(errs, fmt.Errorf("%s:%d: block not closed", name, cur.line))
	}
	if pending != nil {
		errs = append(errs, fmt.Errorf("%s:%d: marker not followed by a block", name, pendingLine))
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", name, err))
	}
	return out, errors.Join(errs...)
}

func TestParseBlocks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		doc     string
		want    []block // file, line and text omitted when empty
		wantErr string
	}{
		{name: "run", doc: "<!-- test: run -->\n```sh\necho one\n```\n", want: []block{{lang: "sh", text: "echo one\n", mark: &mark{run: true}}}},
		{name: "run with exit", doc: "<!-- test: run exit=3 -->\n\n```bash\nfalse\n```\n", want: []block{{lang: "bash", text: "false\n", mark: &mark{run: true, exit: 3}}}},
		{name: "skip with reason", doc: "<!-- test: skip reason=\"needs a running node\" -->\n```console\n$ x\n```\n", want: []block{{lang: "console", text: "$ x\n", mark: &mark{reason: "needs a running node"}}}},
		{name: "indented block dedented", doc: "- item:\n\n  <!-- test: run -->\n  ```sh\n  echo a\n    b\n  ```\n", want: []block{{lang: "sh", text: "echo a\n  b\n", mark: &mark{run: true}}}},
		{name: "text and go need no marker", doc: "```text\nout\n```\n```go\nx := 1\n```\n", want: []block{{lang: "text", text: "out\n"}, {lang: "go", text: "x := 1\n"}}},
		{name: "unmarked shell block", doc: "```sh\nrm -rf /\n```\n", wantErr: "```sh block without a marker"},
		{name: "unmarked console block", doc: "```console\n$ ls\n```\n", wantErr: "```console block without a marker"},
		{name: "fence without language", doc: "```\nbulkhead node status\n```\n", wantErr: "a fence names its language"},
		{name: "skip without reason", doc: "<!-- test: skip -->\n```sh\nx\n```\n", wantErr: `says why: reason="..."`},
		{name: "empty reason", doc: "<!-- test: skip reason=\" \" -->\n```sh\nx\n```\n", wantErr: `says why`},
		{name: "exit on skip", doc: "<!-- test: skip exit=3 reason=\"x\" -->\n```sh\nx\n```\n", wantErr: "exit= does not go with skip"},
		{name: "bad exit", doc: "<!-- test: run exit=many -->\n```sh\nx\n```\n", wantErr: "exit=many is not an exit status"},
		{name: "misspelt marker", doc: "<!-- test: runn -->\n```sh\nx\n```\n", wantErr: "want <!-- test: run -->"},
		{name: "marker before prose", doc: "<!-- test: run -->\nsome text\n```sh\nx\n```\n", wantErr: "marker not followed by a block"},
		{name: "marker before json", doc: "<!-- test: run -->\n```json\n{}\n```\n", wantErr: "test marker before a ```json block"},
		{name: "marker at the end", doc: "text\n<!-- test: run -->\n", wantErr: "marker not followed by a block"},
		{name: "unclosed", doc: "<!-- test: run -->\n```sh\nx\n", wantErr: "block not closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseBlocks("t.md", []byte(tc.doc))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("blocks %+v, want %+v", got, tc.want)
			}
			for i, w := range tc.want {
				g := got[i]
				if g.lang != w.lang || g.text != w.text || (g.mark == nil) != (w.mark == nil) || (g.mark != nil && *g.mark != *w.mark) {
					t.Errorf("block %d: %+v (mark %+v), want %+v (mark %+v)", i, g, g.mark, w, w.mark)
				}
			}
		})
	}
}

// repoRoot is the repository's root directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

// allBlocks parses the README and docs/*.md; every marker and fence must be
// well formed and every shell block marked.
func allBlocks(t *testing.T) []block {
	t.Helper()
	repo := repoRoot(t)
	docs, err := filepath.Glob(filepath.Join(repo, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join(repo, "README.md"))
	var all []block
	var errs []error
	for _, d := range docs {
		b, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := parseBlocks(filepath.Base(d), b)
		errs = append(errs, err)
		all = append(all, bs...)
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("the documents' blocks:\n%v", err)
	}
	return all
}

// TestEveryShellBlockIsMarked: no shell block of the documents goes unchecked.
func TestEveryShellBlockIsMarked(t *testing.T) {
	run, skip := 0, 0
	for _, b := range allBlocks(t) {
		switch {
		case !b.shell():
		case b.mark.run:
			run++
		default:
			skip++
		}
	}
	if run == 0 {
		t.Fatal("no block is marked <!-- test: run -->")
	}
	t.Logf("%d shell blocks run, %d skipped with a reason", run, skip)
}

// commands returns the shell text of a block: a console block's "$ " lines
// (with their continuation lines), any other block whole.
func commands(b block) string {
	if b.lang != "console" {
		return b.text
	}
	var sb strings.Builder
	cont := false
	for l := range strings.Lines(b.text) {
		if rest, ok := strings.CutPrefix(l, "$ "); ok || cont {
			if ok {
				l = rest
			}
			sb.WriteString(l)
			cont = strings.HasSuffix(strings.TrimRight(l, "\n"), "\\")
		}
	}
	return sb.String()
}

// consoleOutput is what a console block shows as its commands' output.
func consoleOutput(b block) string {
	var sb strings.Builder
	cont := false
	for l := range strings.Lines(b.text) {
		_, isCmd := strings.CutPrefix(l, "$ ")
		if !isCmd && !cont {
			sb.WriteString(l)
		}
		cont = (isCmd || cont) && strings.HasSuffix(strings.TrimRight(l, "\n"), "\\")
	}
	return sb.String()
}

// TestSkippedBlocksParse: a block that cannot run here is still shell that
// parses, so that a reader who substitutes what it says gets a command.
func TestSkippedBlocksParse(t *testing.T) {
	for _, b := range allBlocks(t) {
		if !b.shell() || b.mark.run {
			continue
		}
		cmd := exec.Command("bash", "-n")
		cmd.Stdin = strings.NewReader(commands(b))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s (skipped: %s) is not valid shell: %v\n%s", b, b.mark.reason, err, out)
		}
	}
}

// bulkheadCall finds `bulkhead ...` calls: at the start of a line or after
// a shell operator, as bulkhead, bin/bulkhead or ./bin/bulkhead.
var bulkheadCall = regexp.MustCompile(`(?m)(?:^\s*|[;&|(]\s*|sudo\s+|\$\(\s*)(?:\./)?(?:bin/)?bulkhead\s+([^;&|)#\n]*)`)

// commandWord is a subcommand's name (mig, simulate), not an argument.
var commandWord = regexp.MustCompile(`^[a-z]+$`)

// call is one `bulkhead` command line of a document.
type call struct {
	words []string // up to two leading command words: "mig", "plan"
	flags []string // flag names without dashes, optional ones ([--x N]) too
}

// bulkheadCalls returns the bulkhead commands of a shell script.
func bulkheadCalls(script string) []call {
	var out []call
	for _, m := range bulkheadCall.FindAllStringSubmatch(strings.ReplaceAll(script, "\\\n", " "), -1) {
		var c call
		for _, w := range strings.Fields(m[1]) {
			switch {
			case strings.HasPrefix(w, "-") || strings.HasPrefix(w, "[-"):
				name, _, _ := strings.Cut(strings.TrimLeft(w, "[-"), "=")
				c.flags = append(c.flags, strings.TrimRight(name, "]"))
			case len(c.flags) == 0 && len(c.words) < 2 && commandWord.MatchString(w):
				c.words = append(c.words, w)
			}
		}
		out = append(out, c)
	}
	return out
}

// checkCall runs the command's --help (which opens nothing) and checks that
// the command exists and has every flag the call uses.
func checkCall(bin string, c call) error {
	if len(c.words) == 0 {
		return errors.New("names no command")
	}
	words := c.words
	help, err := exec.Command(bin, append(words, "--help")...).CombinedOutput()
	if err != nil && len(words) == 2 {
		// The second word may be an argument (policy test rego).
		words = words[:1]
		help, err = exec.Command(bin, append(words, "--help")...).CombinedOutput()
	}
	if err != nil {
		return fmt.Errorf("`bulkhead %s --help`: %v\n%s", strings.Join(words, " "), err, help)
	}
	for _, f := range c.flags {
		// The flag package lists "  -name value"; usage lines "[--name X]".
		if !regexp.MustCompile(`(?m)(^\s+|\[)--?` + regexp.QuoteMeta(f) + `\b`).Match(help) {
			return fmt.Errorf("`bulkhead %s` has no flag -%s; its --help:\n%s", strings.Join(words, " "), f, help)
		}
	}
	return nil
}

func TestBulkheadCalls(t *testing.T) {
	for _, tc := range []struct {
		script string
		want   []call
	}{
		{"bin/bulkhead policy eval --bundle rego --input x.json\n", []call{{[]string{"policy", "eval"}, []string{"bundle", "input"}}}},
		{"sudo bulkhead node status --json   # all of it\n", []call{{[]string{"node", "status"}, []string{"json"}}}},
		{"bulkhead mig plan --gpu h200 [--gpus N] --request 3g.71gb\n", []call{{[]string{"mig", "plan"}, []string{"gpu", "gpus", "request"}}}},
		{"x=$(./bin/bulkhead policy verify --bundle=b.tar.gz) && bulkhead netpol -pin-dir /p endpoints\n",
			[]call{{[]string{"policy", "verify"}, []string{"bundle"}}, {[]string{"netpol"}, []string{"pin-dir"}}}},
		{"bulkhead mig simulate --gpu h200 \\\n  --load 1.5\n", []call{{[]string{"mig", "simulate"}, []string{"gpu", "load"}}}},
		{"echo bulkhead is a runtime\n# bulkhead node gc\n", nil},
	} {
		if got := bulkheadCalls(tc.script); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("bulkheadCalls(%q) = %v, want %v", tc.script, got, tc.want)
		}
	}
}

// builtBulkhead is bin/bulkhead, or a skip when `make build` has not run.
func builtBulkhead(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(repoRoot(t), "bin", "bulkhead")
	if _, err := os.Stat(bin); err != nil {
		t.Skip("needs bin/bulkhead: run `make build` first")
	}
	return bin
}

func TestCheckCall(t *testing.T) {
	bin := builtBulkhead(t)
	for _, tc := range []struct {
		c       call
		wantErr string
	}{
		{call{[]string{"policy", "eval"}, []string{"bundle", "input", "data"}}, ""},
		{call{[]string{"policy", "test"}, []string{"threshold", "v"}}, ""},
		{call{[]string{"node", "status"}, []string{"json", "config"}}, ""},
		{call{[]string{"policy", "eval"}, []string{"bundel"}}, "has no flag -bundel"},
		{call{[]string{"nodes", "status"}, nil}, "--help`"},
		{call{nil, nil}, "names no command"},
	} {
		err := checkCall(bin, tc.c)
		if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("checkCall(%v) = %v, want %q", tc.c, err, tc.wantErr)
		}
	}
}

// TestDocsCallRealCommands: every `bulkhead` command a shell block shows,
// run or skipped, exists and accepts the flags it is shown with.
func TestDocsCallRealCommands(t *testing.T) {
	bin := builtBulkhead(t)
	checked := 0
	for _, b := range allBlocks(t) {
		if !b.shell() {
			continue
		}
		for _, c := range bulkheadCalls(commands(b)) {
			if err := checkCall(bin, c); err != nil {
				t.Errorf("%s: %v", b, err)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no bulkhead command found in the documents' shell blocks")
	}
	t.Logf("%d bulkhead commands checked", checked)
}

// TestDocBlocksRun runs every block marked <!-- test: run -->.
func TestDocBlocksRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the documents' commands (opa builds, simulations): not in -short")
	}
	all := allBlocks(t)
	repo := repoRoot(t)
	if _, err := os.Stat(filepath.Join(repo, "bin", "bulkhead")); err != nil {
		t.Skip("the docs call bin/bulkhead: run `make build` first")
	}
	home, _ := os.UserHomeDir()
	tools := filepath.Join(home, ".cache", "bulkhead", "tools")
	if d := os.Getenv("TOOLS_DIR"); d != "" && filepath.Clean(d) != tools {
		t.Skip("TOOLS_DIR is not the default: the docs find the tools in ~/.cache/bulkhead/tools")
	}
	// A reader's shell: neither bin/ nor the tools directory on PATH (make
	// test puts the tools there), TOOLS_DIR unset.
	var path []string
	for _, p := range filepath.SplitList(os.Getenv("PATH")) {
		if c := filepath.Clean(p); c != filepath.Join(tools, "bin") && c != filepath.Join(repo, "bin") {
			path = append(path, p)
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TOOLS_DIR=") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+strings.Join(path, string(os.PathListSeparator)))
	for _, b := range all {
		if !b.shell() || !b.mark.run {
			continue
		}
		t.Run(b.String(), func(t *testing.T) {
			script := commands(b)
			for _, tool := range []string{"opa", "openssl", "jq"} {
				if !regexp.MustCompile(`\b` + tool + `\b`).MatchString(script) {
					continue
				}
				if _, err := os.Stat(filepath.Join(tools, "bin", tool)); err == nil {
					continue
				}
				if _, err := exec.LookPath(tool); err != nil {
					t.Skipf("the block needs %s: `make tools` (opa) or apt-get install %s", tool, tool)
				}
			}
			scratch := t.TempDir()
			for _, p := range []string{"rego", "deploy", "Makefile", "go.mod", "go.sum", "test/scripts", "test/cluster/tools"} {
				dst := filepath.Join(scratch, p)
				if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
					t.Fatal(err)
				}
				if out, err := exec.Command("cp", "-a", filepath.Join(repo, p), dst).CombinedOutput(); err != nil {
					t.Fatalf("cp %s: %v: %s", p, err, out)
				}
			}
			if err := os.Symlink(filepath.Join(repo, "bin"), filepath.Join(scratch, "bin")); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("bash", "-eu", "-o", "pipefail", "-c", script)
			cmd.Dir, cmd.Env = scratch, env
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			switch {
			case errors.As(err, &ee):
				code = ee.ExitCode()
			case err != nil:
				t.Fatal(err)
			}
			if code != b.mark.exit {
				t.Fatalf("%s as pasted: exit %d, the marker says %d\n--- stdout ---\n%s--- stderr ---\n%s--- block ---\n%s", b, code, b.mark.exit, stdout.String(), stderr.String(), b.text)
			}
			if b.lang == "console" {
				if want := consoleOutput(b); stdout.String() != want {
					t.Fatalf("%s: the output differs from the document's\n--- got ---\n%s--- document ---\n%s", b, stdout.String(), want)
				}
			}
		})
	}
}
