package admission

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// TestScanQuantities: quantity-shaped strings with absurd digits or
// exponents are refused by field path before anything parses them; every
// other string, and malformed JSON, passes to the decoder.
func TestScanQuantities(t *testing.T) {
	long := strings.Repeat("9", 65)
	tests := []struct {
		name, raw string
		// want is a substring of the error; "" means no error.
		want string
	}{
		{name: "ordinary", raw: `{"spec":{"containers":[{"resources":{"limits":{"memory":"2Gi","cpu":"500m","x":"1e3","y":"1.5E-9"}}}]}}`},
		{name: "negative exponent", raw: `{"spec":{"containers":[{"name":"a"},{"resources":{"limits":{"memory":"1e-30000000"}}}]}}`,
			want: "spec.containers[1].resources.limits.memory: quantity refused before parsing: exponent e-30000000"},
		{name: "huge exponent", raw: `{"a":[1,2,{"b":"1E+1000000000"}]}`, want: "a[2].b: quantity refused before parsing: exponent"},
		{name: "exponent 65", raw: `{"m":"1e65"}`, want: "m: quantity refused"},
		{name: "exponent 64", raw: `{"m":"1e-64"}`},
		{name: "long mantissa", raw: `{"m":"` + long + `Ki"}`, want: "m: quantity refused before parsing: 65 digits"},
		{name: "long decimal", raw: `{"m":"0.` + long + `"}`, want: "66 digits"},
		{name: "escaped", raw: `{"m":"\u0031e-30000000"}`, want: "m: quantity refused"},
		{name: "key not a value", raw: `{"1e-30000000":"1"}`},
		{name: "not a quantity", raw: `{"args":["--lr=1e-30000000","` + long + `x","2026-12-03","e-99999","-"]}`},
		{name: "sign", raw: `{"m":"-1e-999"}`, want: "exponent"},
		{name: "whitespace and nesting", raw: " {\n\t\"a\" : { \"b\" : [ [ ] , { } , \"1e-100\" ] } } ", want: "a.b[2]: quantity refused"},
		{name: "scalars", raw: `{"a":true,"b":null,"c":-1.5e3,"d":[false],"e":"1e-99"}`, want: "e: quantity refused"},
		{name: "malformed", raw: `{"a":"1e-99`},
		{name: "malformed key", raw: `{"a" 1}`},
		{name: "too deep", raw: strings.Repeat("[", maxJSONDepth+1) + `"1e-99"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := scanQuantities([]byte(tt.raw))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("err = %v, want none", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrQuantityAbsurd)):
				t.Fatalf("err = %v, want ErrQuantityAbsurd containing %q", err, tt.want)
			}
		})
	}
}

// TestReviewRefusesHostileQuantities: the 609-byte reviews that held the
// webhook for seconds to minutes are refused with the object and field
// named, in every kind that carries a pod.
func TestReviewRefusesHostileQuantities(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: openEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"1e-30000000", "1e-1000000000", strings.Repeat("1", 1<<20)} {
		for _, ns := range []string{"agents", "platform"} {
			req := reviewOf(t, ns, kindPod, podWith(`"memory":"`+q+`"`))
			resp := rev.Review(context.Background(), req)
			if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusBadRequest {
				t.Fatalf("%.20s in %s: allowed = %v, result %+v; want a 400", q, ns, resp.Allowed, resp.Result)
			}
			for _, w := range []string{`pod "p" in namespace`, "spec.containers[0].resources.limits.memory", "refused before parsing"} {
				if !strings.Contains(resp.Result.Message, w) {
					t.Errorf("message %q lacks %q", resp.Result.Message, w)
				}
			}
		}
	}
}

// blockingDecider decides only when its context ends, or after sleep when
// it ignores the context.
type blockingDecider struct{ sleep time.Duration }

func (b blockingDecider) Decide(ctx context.Context, _ policy.Input) (policy.Decision, error) {
	if b.sleep > 0 {
		time.Sleep(b.sleep)
		return policy.Decision{Allow: true}, nil
	}
	<-ctx.Done()
	return policy.Decision{}, ctx.Err()
}

// TestReviewDeadline: a review that runs past its deadline is refused,
// its evaluation cancelled, and an allow that comes too late is not sent.
func TestReviewDeadline(t *testing.T) {
	_, base := readReview(t, "pod-allowed.json")
	for _, tt := range []struct {
		name    string
		decider policy.Decider
	}{
		{name: "evaluation cancelled", decider: blockingDecider{}},
		{name: "late allow refused", decider: blockingDecider{sleep: 100 * time.Millisecond}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rev, err := NewReviewer(Options{Decider: tt.decider, Deadline: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			resp := rev.Review(context.Background(), base.Request.DeepCopy())
			if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusGatewayTimeout {
				t.Fatalf("allowed = %v, result %+v; want a 504", resp.Allowed, resp.Result)
			}
			if !strings.Contains(resp.Result.Message, "deadline of 20ms") || resp.UID != base.Request.UID {
				t.Errorf("message %q, uid %q", resp.Result.Message, resp.UID)
			}
		})
	}
	if _, err := NewReviewer(Options{Decider: blockingDecider{}, Deadline: -1}); err == nil || !strings.Contains(err.Error(), "Options.Deadline") {
		t.Errorf("negative deadline: err = %v", err)
	}
}

// TestBadRequestsNameObjectAndField: a 400 names the object (kind, name,
// namespace) and the field that could not be read.
func TestBadRequestsNameObjectAndField(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: openEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	deployment := `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"p"},"spec":{"selector":{},"template":{"spec":{"containers":[{"name":"a","image":"b","resources":{"limits":{"memory":"%s"}}}],"overhead":{}}}}}`
	tests := []struct {
		name   string
		object string
		kind   string
		want   []string
	}{
		{name: "quantity with a bad suffix", kind: "Deployment", object: strings.Replace(deployment, "%s", "2GB", 1),
			want: []string{`deployment "p" in namespace "agents"`, `spec.template.spec.containers[0].resources.limits.memory: "2GB"`}},
		{name: "quantity that is a word", kind: "Deployment", object: strings.Replace(deployment, "%s", "lots", 1),
			want: []string{`deployment "p"`, "spec.template.spec.containers[0].resources.limits.memory"}},
		{name: "wrong type", kind: "Pod", object: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":7}`,
			want: []string{`pod "p" in namespace "agents"`, "spec"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind := kindPod
			if tt.kind == "Deployment" {
				kind = kindDeployment
			}
			resp := rev.Review(context.Background(), reviewOf(t, "agents", kind, tt.object))
			if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusBadRequest {
				t.Fatalf("allowed = %v, result %+v; want a 400", resp.Allowed, resp.Result)
			}
			for _, w := range tt.want {
				if !strings.Contains(resp.Result.Message, w) {
					t.Errorf("message %q lacks %q", resp.Result.Message, w)
				}
			}
		})
	}
}
