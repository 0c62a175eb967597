// Package docs holds Bulkhead's documentation. Its test runs the shell blocks
// the documents mark as runnable, so that a block pasted by a reader works.
//
// A block is runnable when the line before its opening fence is
//
//	<!-- test: run -->
//
// It then runs with `bash -eu -o pipefail` in a scratch directory holding a
// copy of what a fresh clone has that the docs use (rego/, deploy/, the
// Makefile, go.mod, test/scripts) and the repository's bin/ (`make build`).
// Blocks not marked show placeholders (NODE, REGISTRY, TAG) that the text
// around them names.
package docs

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const marker = "<!-- test: run -->"

type block struct {
	file string
	line int
	text string
}

// runnableBlocks returns the marked ```sh blocks of a Markdown file.
func runnableBlocks(path string) ([]block, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []block
	var cur *block
	marked := false
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		l := sc.Text()
		switch {
		case cur != nil && strings.TrimSpace(l) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += l + "\n"
		case strings.TrimSpace(l) == marker:
			marked = true
			continue
		case marked && strings.TrimSpace(l) == "```sh":
			cur = &block{file: filepath.Base(path), line: n}
		case marked && strings.TrimSpace(l) != "":
			return nil, fmt.Errorf("%s:%d: %s must be followed by a ```sh block", path, n, marker)
		}
		if strings.TrimSpace(l) != "" {
			marked = false
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: block not closed", path, cur.line)
	}
	return out, sc.Err()
}

func TestRunnableBlocksParse(t *testing.T) {
	dir := t.TempDir()
	doc := "# T\n\n" + marker + "\n```sh\necho one\n```\n\n```sh\nnot marked\n```\n" + marker + "\n\n```sh\necho two\n```\n"
	p := filepath.Join(dir, "t.md")
	if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	bs, err := runnableBlocks(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 2 || bs[0].text != "echo one\n" || bs[1].text != "echo two\n" {
		t.Fatalf("blocks %+v", bs)
	}
}

// TestDocBlocksRun runs every marked block of docs/*.md and the README.
func TestDocBlocksRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the documents' commands (opa builds, go list): not in -short")
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	docs, _ := filepath.Glob(filepath.Join(repo, "docs", "*.md"))
	docs = append(docs, filepath.Join(repo, "README.md"))
	var all []block
	for _, d := range docs {
		bs, err := runnableBlocks(d)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, bs...)
	}
	if len(all) == 0 {
		t.Fatal("no block is marked " + marker)
	}
	if _, err := os.Stat(filepath.Join(repo, "bin", "bulkhead")); err != nil {
		t.Skip("the docs call bin/bulkhead: run `make build` first")
	}
	tools := os.Getenv("TOOLS_DIR")
	if tools == "" {
		home, _ := os.UserHomeDir()
		tools = filepath.Join(home, ".cache", "bulkhead", "tools")
	}
	if os.Getenv("TOOLS_DIR") != "" && tools != filepath.Join(os.Getenv("HOME"), ".cache", "bulkhead", "tools") {
		t.Skip("TOOLS_DIR is not the default: the docs find the tools in ~/.cache/bulkhead/tools")
	}
	path := filepath.Join(repo, "bin") + ":" + os.Getenv("PATH")
	for _, b := range all {
		t.Run(fmt.Sprintf("%s:%d", b.file, b.line), func(t *testing.T) {
			for _, tool := range []string{"opa", "openssl", "jq"} {
				if strings.Contains(b.text, tool) || (tool != "openssl" && strings.Contains(b.text, "build.sh")) {
					if _, err := exec.LookPath(filepath.Join(tools, "bin", tool)); err != nil {
						if _, err := exec.LookPath(tool); err != nil {
							t.Skipf("the block needs %s: `make tools` (opa) or apt-get install %s", tool, tool)
						}
					}
				}
			}
			scratch := t.TempDir()
			for _, p := range []string{"rego", "deploy", "Makefile", "go.mod", "go.sum", "test/scripts"} {
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
			cmd := exec.Command("bash", "-eu", "-o", "pipefail", "-c", b.text)
			cmd.Dir = scratch
			// As a reader's shell has it: bin/ on PATH (the docs say so),
			// TOOLS_DIR unset, the tools only where `make tools` put them.
			var env []string
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "TOOLS_DIR=") && !strings.HasPrefix(kv, "PATH=") {
					env = append(env, kv)
				}
			}
			cmd.Env = append(env, "PATH="+path)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s:%d as pasted: %v\n%s\n--- block ---\n%s", b.file, b.line, err, out, b.text)
			}
		})
	}
}
