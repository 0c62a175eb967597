package policy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestDecisionLogMasksSecrets(t *testing.T) {
	var buf bytes.Buffer
	e, err := Open(context.Background(), Options{
		BundlePath:               repoPath(t, "rego"),
		DataPath:                 repoPath(t, "rego/examples/tenants.demo.json"),
		InsecureSkipVerification: true,
		DecisionLog:              &buf,
		Logger:                   quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	in := agentPod()
	in.Pod.Containers[0].Env = map[string]string{"OPENAI_API_KEY": "sk-live-123", "MODE": "fast"}
	in.Pod.Annotations = map[string]string{
		"kubectl.kubernetes.io/last-applied-configuration": `{"env": "sk-live-123"}`,
		"example.com/auth-token":                           "tok-456",
		"bulkhead.dev/gpu":                                 "1g.18gb",
	}
	in.Pod.Labels = map[string]string{"db-password": "hunter2", "app": "agent"}
	d, err := e.Decide(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	line := buf.String()
	for _, secret := range []string{"sk-live-123", "tok-456", "hunter2"} {
		if strings.Contains(line, secret) {
			t.Errorf("decision log contains %q: %s", secret, line)
		}
	}
	var entry struct {
		DecisionID string         `json:"decision_id"`
		Revision   string         `json:"revision"`
		Input      map[string]any `json:"input"`
		Result     Decision       `json:"result"`
		Masked     []string       `json:"masked"`
		LatencyNS  *int64         `json:"latency_ns"`
	}
	if err := json.Unmarshal([]byte(line), &entry); err != nil {
		t.Fatalf("log line is not JSON: %v\n%s", err, line)
	}
	if entry.DecisionID != d.ID || entry.Revision != "bulkhead-default-1" || !entry.Result.Allow || entry.LatencyNS == nil {
		t.Errorf("entry = %+v, decision %s", entry, d.ID)
	}
	pod := entry.Input["pod"].(map[string]any)
	ann := pod["annotations"].(map[string]any)
	if _, kept := ann["kubectl.kubernetes.io/last-applied-configuration"]; kept {
		t.Error("bundle mask did not remove last-applied-configuration")
	}
	if ann["bulkhead.dev/gpu"] != "1g.18gb" {
		t.Errorf("a harmless annotation was masked: %v", ann)
	}
	if got := pod["labels"].(map[string]any)["app"]; got != "agent" {
		t.Errorf("label app = %v", got)
	}
	env := pod["containers"].([]any)[0].(map[string]any)["env"].(map[string]any)
	if env["MODE"] != maskedValue || env["OPENAI_API_KEY"] != maskedValue {
		t.Errorf("env not masked: %v", env)
	}
	for _, want := range []string{
		"/input/pod/containers/0/env/OPENAI_API_KEY",
		"/input/pod/annotations/example.com~1auth-token",
		"/input/pod/annotations/kubectl.kubernetes.io~1last-applied-configuration",
		"/input/pod/labels/db-password",
	} {
		if !strings.Contains(strings.Join(entry.Masked, " "), want) {
			t.Errorf("masked %v lacks %s", entry.Masked, want)
		}
	}
}

func TestMaskOps(t *testing.T) {
	tests := []struct {
		name    string
		mask    any
		want    string
		wantErr string
	}{
		{"remove", []any{"/input/a"}, `{"input":{"b":[1,2]},"result":{}}`, ""},
		{"remove array element", []any{"/input/b/0"}, `{"input":{"a":"x","b":[null,2]},"result":{}}`, ""},
		{"upsert new path", []any{map[string]any{"op": "upsert", "path": "/input/c/d", "value": "m"}}, `{"input":{"a":"x","b":[1,2],"c":{"d":"m"}},"result":{}}`, ""},
		{"missing path is ignored", []any{"/input/zzz/y"}, `{"input":{"a":"x","b":[1,2]},"result":{}}`, ""},
		{"bad root", []any{"/secret"}, "", "must start with /input or /result"},
		{"bad op", []any{map[string]any{"op": "explode", "path": "/input/a"}}, "", "not remove or upsert"},
		{"not a set", "x", "", "want a set"},
		{"bad entry", []any{7.0}, "", "not a pointer or an object"},
		{"empty pointer", []any{"/"}, "", "must start with / and name a field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := map[string]any{"input": map[string]any{"a": "x", "b": []any{1.0, 2.0}}, "result": map[string]any{}}
			ops, err := parseMaskOps(tt.mask)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseMaskOps = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, op := range ops {
				op.apply(doc)
			}
			got, _ := json.Marshal(doc)
			if string(got) != tt.want {
				t.Errorf("doc = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestRotatingFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "decisions.log")
	rf := &RotatingFile{Path: path, MaxBytes: 100, Backups: 2}
	for i := 0; i < 10; i++ {
		if _, err := fmt.Fprintf(rf, "line %02d %s\n", i, strings.Repeat("x", 30)); err != nil { // 40 bytes
			t.Fatal(err)
		}
	}
	if err := rf.Close(); err != nil {
		t.Fatal(err)
	}
	// 10 lines of 40 bytes, 2 per file: current has 8-9, .1 has 6-7, .2 has 4-5.
	for suffix, first := range map[string]int{"": 8, ".1": 6, ".2": 4} {
		b, err := os.ReadFile(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 100 {
			t.Errorf("%s is %d bytes, over the limit", suffix, len(b))
		}
		if want := fmt.Sprintf("line %02d ", first); !strings.HasPrefix(string(b), want) {
			t.Errorf("file%s starts %q, want %q", suffix, string(b)[:8], want)
		}
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Errorf("%s.3 exists beyond Backups", path)
	}
}

func TestDecisionLogFileRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log", "decisions.jsonl")
	e, err := Open(context.Background(), Options{
		BundlePath:               repoPath(t, "rego"),
		DataPath:                 repoPath(t, "rego/examples/tenants.demo.json"),
		InsecureSkipVerification: true,
		DecisionLogFile:          path,
		DecisionLogMaxBytes:      8 << 10,
		DecisionLogBackups:       3,
		Logger:                   quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for i := 0; i < 40; i++ {
		d, _ := e.Decide(context.Background(), agentPod())
		ids[d.ID] = true
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	lines := 0
	for _, suffix := range []string{"", ".1", ".2", ".3"} {
		f, err := os.Open(path + suffix)
		if err != nil {
			t.Fatalf("rotation did not produce %s%s: %v", path, suffix, err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var entry struct {
				DecisionID string `json:"decision_id"`
			}
			if err := json.Unmarshal(sc.Bytes(), &entry); err != nil || !ids[entry.DecisionID] {
				t.Errorf("bad line in %s: %v %s", suffix, err, sc.Text())
			}
			lines++
		}
		f.Close()
	}
	if lines == 0 || lines >= 40 {
		t.Errorf("kept %d lines; want some, and fewer than 40 after dropping the oldest file", lines)
	}
}

// TestAnnotationValuesMaskedByDefault: an annotation's value reaches the
// decision log only under bulkhead.dev/ or in the bundle's allow-list
// (UnmaskedAnnotationsPath); last-applied-configuration and secret-looking
// keys stay masked whatever the list says, and so do env values.
func TestAnnotationValuesMaskedByDefault(t *testing.T) {
	allowing := t.TempDir()
	if err := os.CopyFS(allowing, os.DirFS(repoPath(t, "rego"))); err != nil {
		t.Fatal(err)
	}
	allowList := `{"unmasked_annotations": ["example.com/team", "app.kubernetes.io/", "kubectl.kubernetes.io/", "example.com/"]}`
	if err := os.MkdirAll(filepath.Join(allowing, "bulkhead", "decision_log"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(allowing, "bulkhead", "decision_log", "data.json"), []byte(allowList), 0o644); err != nil {
		t.Fatal(err)
	}
	annotations := map[string]string{
		"bulkhead.dev/gpu-profile":    "1g.18gb",
		"example.com/team":            "ml",
		"app.kubernetes.io/name":      "agent",
		"example.com/db-dsn":          "postgres://app:pw-789@db/prod",
		"example.com/auth-token":      "tok-456",
		lastAppliedConfiguration:      `{"env": "sk-live-123"}`,
		"sidecar.istio.io/inject":     "true",
		"kubernetes.io/config.source": "api",
	}
	tests := []struct {
		name   string
		bundle string
		logged []string // annotation keys whose values stay; every other is masked
	}{
		{name: "default bundle", bundle: repoPath(t, "rego"), logged: []string{"bulkhead.dev/gpu-profile"}},
		{name: "bundle with an allow-list", bundle: allowing,
			logged: []string{"bulkhead.dev/gpu-profile", "example.com/team", "app.kubernetes.io/name", "example.com/db-dsn"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			e, err := Open(context.Background(), Options{BundlePath: tc.bundle, DataPath: repoPath(t, "rego/examples/tenants.demo.json"),
				InsecureSkipVerification: true, DecisionLog: &buf, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			in := agentPod()
			in.Pod.Annotations = maps.Clone(annotations)
			in.Pod.Containers[0].Env = map[string]string{"MODE": "fast"}
			if _, err := e.Decide(context.Background(), in); err != nil {
				t.Fatal(err)
			}
			var entry struct {
				Input struct {
					Pod struct {
						Annotations map[string]string `json:"annotations"`
						Containers  []struct {
							Env map[string]string `json:"env"`
						} `json:"containers"`
					} `json:"pod"`
				} `json:"input"`
			}
			if err := json.Unmarshal(buf.Bytes(), &entry); err != nil {
				t.Fatalf("%v: %s", err, buf.String())
			}
			for k, v := range annotations {
				got, present := entry.Input.Pod.Annotations[k]
				switch {
				case slices.Contains(tc.logged, k) && got != v:
					t.Errorf("annotation %s = %q, want its value %q", k, got, v)
				case !slices.Contains(tc.logged, k) && present && got != maskedValue:
					t.Errorf("annotation %s = %q, want it masked", k, got)
				}
			}
			if env := entry.Input.Pod.Containers[0].Env["MODE"]; env != maskedValue {
				t.Errorf("env MODE = %q, want it masked", env)
			}
			for _, secret := range []string{"pw-789", "tok-456", "sk-live-123"} {
				if strings.Contains(buf.String(), secret) && !(tc.name == "bundle with an allow-list" && secret == "pw-789") {
					t.Errorf("decision log holds %q: %s", secret, buf.String())
				}
			}
		})
	}
}

func TestUnmaskedAnnotationsShape(t *testing.T) {
	for _, tc := range []struct {
		data string
		want []string
		err  string
	}{
		{data: `{}`},
		{data: `{"bulkhead": {"decision_log": {"unmasked_annotations": ["a/b", "c/"]}}}`, want: []string{"a/b", "c/"}},
		{data: `{"bulkhead": {"decision_log": {"unmasked_annotations": "a/b"}}}`, err: "want an array"},
		{data: `{"bulkhead": {"decision_log": {"unmasked_annotations": ["a", 1]}}}`, err: "is not an annotation key"},
		{data: `{"bulkhead": {"decision_log": {"unmasked_annotations": [""]}}}`, err: "is not an annotation key"},
	} {
		var doc map[string]any
		if err := json.Unmarshal([]byte(tc.data), &doc); err != nil {
			t.Fatal(err)
		}
		got, err := unmaskedAnnotations(doc)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.data, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.data, got, err, tc.want)
		}
	}
}
