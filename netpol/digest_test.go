package netpol

import (
	"testing"

	"github.com/cilium/ebpf/asm"
)

// The digest that names a pinned program changes with anything that
// changes the program once linked: an instruction, the map a load refers
// to, a jump's target label, where a label sits. Equal programs share it.
func TestProgramDigest(t *testing.T) {
	// Two labels, "a" and "b", at instructions labelA and 3.
	build := func(mapName, target string, labelA int, imm int32) asm.Instructions {
		insns := asm.Instructions{
			asm.LoadMapPtr(asm.R1, 0).WithReference(mapName),
			asm.JEq.Imm(asm.R1, 0, target),
			asm.Mov.Imm(asm.R0, imm),
			asm.Mov.Imm(asm.R0, 2).WithSymbol("b"),
			asm.Return(),
		}
		insns[labelA] = insns[labelA].WithSymbol("a")
		return insns
	}
	digest := func(insns asm.Instructions) [32]byte {
		t.Helper()
		d, err := programDigest(insns)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	base := digest(build("endpoints", "a", 2, 1))
	if again := digest(build("endpoints", "a", 2, 1)); again != base {
		t.Error("the same program has two digests")
	}
	for _, tt := range []struct {
		name  string
		insns asm.Instructions
	}{
		{"other constant", build("endpoints", "a", 2, 7)},
		{"other map", build("drops", "a", 2, 1)},
		{"other jump target", build("endpoints", "b", 2, 1)},
		{"label elsewhere", build("endpoints", "a", 4, 1)},
	} {
		if digest(tt.insns) == base {
			t.Errorf("%s: same digest as the base program", tt.name)
		}
	}
}
