package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMIGCommand(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.txt")
	if err := os.WriteFile(trace, []byte("0 arrive a t1 1g.18gb\n1 arrive b t2 4g.71gb\n2 depart a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	written := filepath.Join(dir, "synthetic.txt")
	tests := []struct {
		name   string
		args   []string
		rc     int
		stdout []string
		stderr []string
	}{
		{"profiles", []string{"profiles", "--gpu", "h200"}, 0,
			[]string{"H200-141GB", "3g.71gb     3        71 GB   4      2          {0,4}:4", "7g.141gb    7        141 GB  8      1          {0}:8"}, nil},
		{"profiles b200", []string{"profiles", "--gpu", "b200"}, 0, []string{"1g.23gb+me", "1g.45gb", "7g.180gb"}, nil},
		{"profiles unknown model", []string{"profiles", "--gpu", "t4"}, 2, nil, []string{`--gpu: gpu model "t4": unknown`}},
		{"plan fits", []string{"plan", "--gpu", "h200", "--request", "3g.71gb,2g.35gb,1g.18gb"}, 0,
			[]string{"1        0    3g.71gb  4      4     3", "2        0    2g.35gb  0      2     2"}, nil},
		{"plan across gpus", []string{"plan", "--gpu", "h100", "--gpus", "2", "--request", "7g.80gb,7g.80gb"}, 0,
			[]string{"1        0    7g.80gb  0      8     7", "2        1    7g.80gb  0      8     7"}, nil},
		{"plan does not fit", []string{"plan", "--gpu", "h200", "--request", "4g.71gb,3g.71gb,1g.18gb"}, 1, nil,
			[]string{"insufficient resources: 1g.18gb for tenant default (owner request-3) does not fit: gpu0: 1g.18gb: memory slots taken (request 3 of 3)"}},
		{"plan unknown profile", []string{"plan", "--gpu", "h200", "--request", "3g.40gb"}, 2, nil, []string{`profile "3g.40gb": not a h200 profile`}},
		{"plan no request", []string{"plan", "--gpu", "h200"}, 2, nil, []string{"--request: name at least one profile"}},
		{"plan bad strategy", []string{"plan", "--gpu", "h200", "--request", "1g.18gb", "--strategy", "random"}, 2, nil, []string{`--strategy "random"`}},
		{"simulate trace", []string{"simulate", "--gpu", "h200", "--gpus", "1", "--trace", trace}, 0,
			[]string{"best-fit                 2/2", "first-fit                1/2", "driver-order             2/2", "exact optimum            2/2  ",
				"exact optimum (compute)  2/2", "best-fit vs exact optimum: acceptance x1.000", "best-fit vs exact optimum (compute): served compute x1.000",
				"acceptance by profile:", "STRATEGY                 1g.18gb  4g.71gb", "first-fit                100.0%   0.0%"}, nil},
		{"simulate synthetic", []string{"simulate", "--gpu", "a100-40gb", "--gpus", "8", "--synthetic", "3", "--arrivals", "300", "--write-trace", written}, 0,
			[]string{"8 x a100-40gb, synthetic seed 3, 300 arrivals", "best-fit", "first-fit", "repack oracle", "exact optimum: skipped",
				"best-fit vs first-fit: acceptance x", "best-fit vs driver-order: acceptance x",
				"dra-first-fit  ", "dra-first-fit-ascending  ", "best-fit vs dra-first-fit: acceptance x"}, nil},
		{"simulate mix and lifetimes", []string{"simulate", "--gpu", "h100", "--gpus", "2", "--synthetic", "1", "--arrivals", "12", "--mix", "large", "--lifetimes", "bimodal"}, 0,
			[]string{"mix large, bimodal lifetimes", "exact optimum (compute)", "best-fit vs exact optimum (compute): served compute x"}, nil},
		{"simulate pooled seeds", []string{"simulate", "--gpu", "h200", "--gpus", "1", "--synthetic", "1", "--arrivals", "12", "--seeds", "3"}, 0,
			[]string{"synthetic seeds 1..3 (3 pooled), 12 arrivals each", "/36 ", "exact optimum            "}, nil},
		{"simulate bad seeds", []string{"simulate", "--gpu", "h200", "--synthetic", "1", "--seeds", "0"}, 2, nil, []string{"--seeds 0"}},
		{"simulate bad mix", []string{"simulate", "--gpu", "h200", "--synthetic", "1", "--mix", "odd"}, 2, nil, []string{`--mix "odd": want one of mixed, small, large, uniform`}},
		{"simulate bad lifetimes", []string{"simulate", "--gpu", "h200", "--synthetic", "1", "--lifetimes", "pareto"}, 2, nil, []string{`lifetimes "pareto"`}},
		{"plan driver order", []string{"plan", "--gpu", "h200", "--request", "1g.18gb,2g.35gb", "--strategy", "driver-order"}, 0,
			[]string{"1        0    1g.18gb  6", "2        0    2g.35gb  4"}, nil},
		{"simulate needs one source", []string{"simulate", "--gpu", "h200"}, 2, nil, []string{"exactly one of --synthetic SEED and --trace FILE"}},
		{"simulate unreadable trace", []string{"simulate", "--gpu", "h200", "--trace", filepath.Join(dir, "none")}, 1, nil, []string{"--trace:"}},
		{"unknown subcommand", []string{"frobnicate"}, 2, nil, []string{`unknown subcommand "frobnicate"`}},
		{"no subcommand", nil, 2, nil, []string{"usage: bulkhead mig"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			rc := migMain(tt.args, &out, &errb)
			if rc != tt.rc {
				t.Fatalf("rc %d, want %d\nstdout:\n%s\nstderr:\n%s", rc, tt.rc, out.String(), errb.String())
			}
			for _, w := range tt.stdout {
				if !strings.Contains(out.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tt.stderr {
				if !strings.Contains(errb.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, errb.String())
				}
			}
		})
	}
	if data, err := os.ReadFile(written); err != nil || !strings.Contains(string(data), " arrive r0 ") {
		t.Fatalf("written trace: %v %.80s", err, data)
	}
}
