package irvm

import (
	"fmt"
	"reflect"
	"testing"
	"unsafe"

	"github.com/open-policy-agent/opa/v1/ast"
)

// sameLoaded reports the first difference between two Programs in what
// Load derives, "" if none: every field, followed through pointers; terms
// compared as values, and by their text (a number keeps its digits);
// built-ins by their implementation; a nil and an empty slice alike.
// Evaluation state is left out: the state pool, the data of the rule
// caches, their entries and counters, the deferrals.
func sameLoaded(a, b *Program) string {
	return diffValues(reflect.ValueOf(a), reflect.ValueOf(b), "Program", map[[2]uintptr]bool{})
}

// evaluationState are the fields sameLoaded leaves out.
var evaluationState = map[string]bool{
	"Program.states": true, "Program.cacheData": true, "Program.deferrals": true,
	"ruleCache.entries": true, "ruleCache.n": true, "ruleCache.lookups": true, "ruleCache.hits": true, "ruleCache.off": true,
}

var termType = reflect.TypeFor[*ast.Term]()

// exported is the value of v, an addressable field that may be unexported.
func exported(v reflect.Value) any {
	return reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem().Interface()
}

func diffValues(a, b reflect.Value, at string, seen map[[2]uintptr]bool) string {
	differ := func(format string, args ...any) string { return at + ": " + fmt.Sprintf(format, args...) }
	switch a.Kind() {
	case reflect.Pointer:
		pa, pb := a.Pointer(), b.Pointer()
		switch {
		case pa == pb:
			return ""
		case pa == 0 || pb == 0:
			return differ("nil and not nil")
		case a.Type() == termType:
			if !a.CanAddr() || !b.CanAddr() {
				return differ("a term sameLoaded cannot read")
			}
			ta, tb := exported(a).(*ast.Term), exported(b).(*ast.Term)
			if ast.Compare(ta.Value, tb.Value) != 0 || ta.String() != tb.String() {
				return differ("%v and %v", ta, tb)
			}
			return ""
		case seen[[2]uintptr{pa, pb}]:
			return ""
		}
		seen[[2]uintptr{pa, pb}] = true
		return diffValues(a.Elem(), b.Elem(), at, seen)
	case reflect.Struct:
		for i := range a.NumField() {
			name := a.Type().Name() + "." + a.Type().Field(i).Name
			if evaluationState[name] {
				continue
			}
			if d := diffValues(a.Field(i), b.Field(i), at+"."+a.Type().Field(i).Name, seen); d != "" {
				return d
			}
		}
	case reflect.Slice, reflect.Array:
		if a.Len() != b.Len() {
			return differ("%d and %d elements", a.Len(), b.Len())
		}
		for i := range a.Len() {
			if d := diffValues(a.Index(i), b.Index(i), fmt.Sprintf("%s[%d]", at, i), seen); d != "" {
				return d
			}
		}
	case reflect.Map:
		if a.Len() != b.Len() {
			return differ("%d and %d entries", a.Len(), b.Len())
		}
		for it := a.MapRange(); it.Next(); {
			other := b.MapIndex(it.Key())
			if !other.IsValid() {
				return differ("no %v in one", it.Key())
			}
			if d := diffValues(it.Value(), other, fmt.Sprintf("%s[%v]", at, it.Key()), seen); d != "" {
				return d
			}
		}
	case reflect.Func:
		if a.Pointer() != b.Pointer() {
			return differ("other functions")
		}
	case reflect.Bool:
		if a.Bool() != b.Bool() {
			return differ("%v and %v", a.Bool(), b.Bool())
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if a.Int() != b.Int() {
			return differ("%d and %d", a.Int(), b.Int())
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if a.Uint() != b.Uint() {
			return differ("%d and %d", a.Uint(), b.Uint())
		}
	case reflect.String:
		if a.String() != b.String() {
			return differ("%q and %q", a.String(), b.String())
		}
	default:
		return differ("a %v, which sameLoaded does not compare", a.Type())
	}
	return ""
}

// TestBinaryFormWritesEveryField: encoder.instr (a has* bit per field),
// encoder.header and encoder.blocks write every field, the decoder's
// namesakes read them back. A new field goes there, then here.
func TestBinaryFormWritesEveryField(t *testing.T) {
	for typ, want := range map[reflect.Type]int{
		reflect.TypeFor[instr]():    17,
		reflect.TypeFor[function](): 7,
		reflect.TypeFor[operand]():  2,
	} {
		if got := typ.NumField(); got != want {
			t.Errorf("%v has %d fields, the binary form %d: write and read the new ones (binary.go)", typ, got, want)
		}
	}
}
