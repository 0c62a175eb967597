package policy

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maskedValue replaces every masked value in the decision log.
const maskedValue = "**masked**"

// secretKey matches annotation and label keys whose values are masked by
// Bulkhead itself, whatever the bundle's data.system.log.mask says.
var secretKey = regexp.MustCompile(`(?i)(secret|token|passw(or)?d|credential|api[-_]?key|private[-_]?key|auth)`)

// logEntry is one line of the decision log.
type logEntry struct {
	DecisionID string    `json:"decision_id"`
	Revision   string    `json:"revision"`
	Timestamp  time.Time `json:"timestamp"`
	Kind       string    `json:"kind"`
	Namespace  string    `json:"namespace"`
	Input      any       `json:"input"`
	Result     any       `json:"result"`
	// Masked lists the JSON pointers that were erased or replaced.
	Masked    []string `json:"masked,omitempty"`
	Error     string   `json:"error,omitempty"`
	LatencyNS int64    `json:"latency_ns"`
}

// requestPrefix is the prefix of the annotations that are requests to
// Bulkhead ("bulkhead.dev/").
const requestPrefix = RequestAnnotationPrefix

// lastAppliedConfiguration is kubectl's copy of the whole object as it was
// applied, env values and all: masked whatever a bundle allows.
const lastAppliedConfiguration = "kubectl.kubernetes.io/last-applied-configuration"

// UnmaskedAnnotationsPath is where a bundle's data may list the annotations
// whose values the decision log keeps besides those under bulkhead.dev/:
// an array of keys, where a key ending in "/" stands for every key under it
// (["app.kubernetes.io/", "example.com/team"]). Only the signed bundle can
// set it: the unsigned data file carries bulkhead.tenants alone.
const UnmaskedAnnotationsPath = "data.bulkhead.decision_log.unmasked_annotations"

// unmaskedAnnotations reads UnmaskedAnnotationsPath from a bundle's data;
// nil when it is not set, an error when it is not an array of strings.
func unmaskedAnnotations(data map[string]any) ([]string, error) {
	var cur any = data
	for _, k := range strings.Split(strings.TrimPrefix(UnmaskedAnnotationsPath, "data."), ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, nil
		}
		if cur, ok = m[k]; !ok {
			return nil, nil
		}
	}
	items, ok := cur.([]any)
	if !ok {
		return nil, fmt.Errorf("%s: want an array of annotation keys, got %s", UnmaskedAnnotationsPath, describeJSON(cur))
	}
	keys := make([]string, 0, len(items))
	for _, it := range items {
		k, ok := it.(string)
		if !ok || k == "" {
			return nil, fmt.Errorf("%s: entry %s is not an annotation key", UnmaskedAnnotationsPath, describeJSON(it))
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// annotationLogged reports whether the value of annotation k may appear in
// the decision log: only under bulkhead.dev/ or in the bundle's allow-list,
// never last-applied-configuration, never a secret-looking key.
func annotationLogged(k string, unmasked []string) bool {
	if k == lastAppliedConfiguration || secretKey.MatchString(k) {
		return false
	}
	if strings.HasPrefix(k, requestPrefix) {
		return true
	}
	for _, a := range unmasked {
		if k == a || (strings.HasSuffix(a, "/") && strings.HasPrefix(k, a)) {
			return true
		}
	}
	return false
}

// builtinMask erases from doc, the JSON form of an Input under "input",
// every container environment value, every annotation value but those
// annotationLogged allows, and the values of secret-looking labels. It
// returns the pointers it touched.
func builtinMask(doc map[string]any, unmasked []string) []string {
	var touched []string
	in, _ := doc["input"].(map[string]any)
	pod, _ := in["pod"].(map[string]any)
	if pod == nil {
		return nil
	}
	for _, field := range []string{"annotations", "labels"} {
		m, _ := pod[field].(map[string]any)
		for k := range m {
			masked := secretKey.MatchString(k)
			if field == "annotations" {
				masked = !annotationLogged(k, unmasked)
			}
			if masked {
				m[k] = maskedValue
				touched = append(touched, "/input/pod/"+field+"/"+escapePointer(k))
			}
		}
	}
	containers, _ := pod["containers"].([]any)
	for i, c := range containers {
		cm, _ := c.(map[string]any)
		env, _ := cm["env"].(map[string]any)
		for k := range env {
			env[k] = maskedValue
			touched = append(touched, fmt.Sprintf("/input/pod/containers/%d/env/%s", i, escapePointer(k)))
		}
	}
	return touched
}

// maskOp is one entry of data.system.log.mask: a bare JSON pointer (remove)
// or {"op": "remove"|"upsert", "path": pointer, "value": v}.
type maskOp struct {
	op    string
	path  []string
	value any
}

func parseMaskOps(v any) ([]maskOp, error) {
	items, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("data.system.log.mask: want a set, got %s", describeJSON(v))
	}
	ops := make([]maskOp, 0, len(items))
	for _, it := range items {
		var op maskOp
		var ptr string
		switch x := it.(type) {
		case string:
			op.op, ptr = "remove", x
		case map[string]any:
			op.op, _ = x["op"].(string)
			ptr, _ = x["path"].(string)
			op.value = x["value"]
			if op.op == "" {
				op.op = "remove"
			}
			if op.op != "remove" && op.op != "upsert" {
				return nil, fmt.Errorf("data.system.log.mask: op %q is not remove or upsert", op.op)
			}
		default:
			return nil, fmt.Errorf("data.system.log.mask: entry %s is not a pointer or an object", describeJSON(it))
		}
		parts, err := splitPointer(ptr)
		if err != nil {
			return nil, fmt.Errorf("data.system.log.mask: %w", err)
		}
		if parts[0] != "input" && parts[0] != "result" {
			return nil, fmt.Errorf("data.system.log.mask: pointer %q must start with /input or /result", ptr)
		}
		op.path = parts
		ops = append(ops, op)
	}
	return ops, nil
}

// apply performs op on doc and reports whether it changed anything.
func (op maskOp) apply(doc map[string]any) bool {
	var parent any = doc
	for _, seg := range op.path[:len(op.path)-1] {
		next, ok := child(parent, seg)
		if !ok {
			if op.op == "remove" {
				return false
			}
			m, isMap := parent.(map[string]any)
			if !isMap {
				return false
			}
			next = map[string]any{}
			m[seg] = next
		}
		parent = next
	}
	last := op.path[len(op.path)-1]
	switch p := parent.(type) {
	case map[string]any:
		if op.op == "remove" {
			if _, ok := p[last]; !ok {
				return false
			}
			delete(p, last)
			return true
		}
		p[last] = op.value
		return true
	case []any:
		i, err := strconv.Atoi(last)
		if err != nil || i < 0 || i >= len(p) {
			return false
		}
		if op.op == "remove" {
			p[i] = nil // keep indexes stable for later pointers
		} else {
			p[i] = op.value
		}
		return true
	}
	return false
}

func child(v any, seg string) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		c, ok := x[seg]
		return c, ok
	case []any:
		i, err := strconv.Atoi(seg)
		if err != nil || i < 0 || i >= len(x) {
			return nil, false
		}
		return x[i], true
	}
	return nil, false
}

func splitPointer(p string) ([]string, error) {
	if !strings.HasPrefix(p, "/") || len(p) < 2 {
		return nil, fmt.Errorf("pointer %q must start with / and name a field", p)
	}
	parts := strings.Split(p[1:], "/")
	for i, s := range parts {
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
	}
	return parts, nil
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// lockedWriter serialises whole lines onto w.
type lockedWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (l *lockedWriter) writeLine(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.w.Write(b)
	return err
}

// RotatingFile is an io.WriteCloser that appends to Path and, when a write
// would take the file past MaxBytes, renames it to Path.1 (shifting older
// files up to Path.<Backups>, dropping the oldest) and starts a new one.
// Safe for concurrent use.
type RotatingFile struct {
	// Path is the active file.
	Path string
	// MaxBytes is the size limit of one file; a single larger write still
	// lands whole in a fresh file.
	MaxBytes int64
	// Backups is how many rotated files are kept.
	Backups int

	mu   sync.Mutex // guards f and size
	f    *os.File
	size int64
}

// Write appends p, rotating first when p would not fit.
func (r *RotatingFile) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		if err := r.open(); err != nil {
			return 0, err
		}
	}
	if r.size > 0 && r.size+int64(len(p)) > r.MaxBytes {
		if err := r.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := r.f.Write(p)
	r.size += int64(n)
	return n, err
}

// Close closes the active file.
func (r *RotatingFile) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}

func (r *RotatingFile) open() error {
	f, err := os.OpenFile(r.Path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	r.f, r.size = f, st.Size()
	return nil
}

func (r *RotatingFile) rotate() error {
	if err := r.f.Close(); err != nil {
		return err
	}
	r.f = nil
	if r.Backups <= 0 {
		if err := os.Remove(r.Path); err != nil && !os.IsNotExist(err) {
			return err
		}
		return r.open()
	}
	_ = os.Remove(fmt.Sprintf("%s.%d", r.Path, r.Backups))
	for i := r.Backups - 1; i >= 1; i-- {
		from := fmt.Sprintf("%s.%d", r.Path, i)
		if err := os.Rename(from, fmt.Sprintf("%s.%d", r.Path, i+1)); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	if err := os.Rename(r.Path, r.Path+".1"); err != nil {
		return err
	}
	return r.open()
}

// describeJSON names the JSON type of a decoded value.
func describeJSON(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case float64, json.Number:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
