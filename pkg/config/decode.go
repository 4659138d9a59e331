package config

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// decoder walks a yaml.Node tree into the config structs field by field, so that it knows the
// line of every field and can report unknown fields and type errors with their place. It
// records the line of every field it sees in lines, keyed by field path.
type decoder struct {
	errs  *errList
	lines map[string]int
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	timeType     = reflect.TypeFor[time.Time]()
)

// decode reads n into out, which must be a pointer to a struct.
func (d *decoder) decode(path string, n *yaml.Node, out any) {
	d.value(path, n, reflect.ValueOf(out).Elem())
}

func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0 {
			return "the quoted string " + strconv.Quote(n.Value)
		}
		return strconv.Quote(n.Value)
	}
	return "nothing"
}

// value reads n into v. A null leaves v (its default) untouched.
func (d *decoder) value(path string, n *yaml.Node, v reflect.Value) {
	n = resolve(n)
	if isNull(n) {
		return
	}
	t := v.Type()
	set := scalarByType[t]
	switch {
	case set != nil:
	case t.Kind() == reflect.Struct:
		d.mapping(path, n, v)
		return
	case t.Kind() == reflect.Slice:
		d.sequence(path, n, v)
		return
	default:
		if set = scalarByKind[t.Kind()]; set == nil {
			// Only reachable if a field of an unsupported type is added to the config structs.
			panic(fmt.Sprintf("config: unsupported field type %s at %s", t, path))
		}
	}
	if msg := set(n, v); msg != "" {
		d.errs.add(n.Line, path, "%s", msg)
	}
}

// A scalarSetter reads the node n into v, or returns what is wrong with n (nothing set).
type scalarSetter func(n *yaml.Node, v reflect.Value) string

// scalarByType and scalarByKind are the setters of the scalars a config holds: by type for the
// named ones, else by kind.
var (
	scalarByType = map[reflect.Type]scalarSetter{durationType: setDuration, timeType: setTime}
	scalarByKind = map[reflect.Kind]scalarSetter{
		reflect.String: setString, reflect.Bool: setBool, reflect.Int: setInt, reflect.Float64: setFloat,
	}
)

func setDuration(n *yaml.Node, v reflect.Value) string {
	if n.Kind != yaml.ScalarNode {
		return "expected a duration such as 30s, got " + describe(n)
	}
	dur, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Sprintf("%q is not a duration (write a number with a unit: 500ms, 30s, 6h)", n.Value)
	}
	v.SetInt(int64(dur))
	return ""
}

func setTime(n *yaml.Node, v reflect.Value) string {
	at, err := time.Parse(time.RFC3339, n.Value)
	if n.Kind != yaml.ScalarNode || err != nil {
		return "expected an RFC 3339 time such as 2027-01-31T00:00:00Z, got " + describe(n)
	}
	v.Set(reflect.ValueOf(at))
	return ""
}

func setString(n *yaml.Node, v reflect.Value) string {
	if n.Kind != yaml.ScalarNode {
		return "expected a string, got " + describe(n)
	}
	v.SetString(n.Value)
	return ""
}

func setBool(n *yaml.Node, v reflect.Value) string {
	b, err := strconv.ParseBool(n.Value)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || err != nil {
		return "expected true or false, got " + describe(n)
	}
	v.SetBool(b)
	return ""
}

func setInt(n *yaml.Node, v reflect.Value) string {
	i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 10, 64)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || err != nil || int64(int(i)) != i {
		return "expected an integer, got " + describe(n)
	}
	v.SetInt(i)
	return ""
}

func setFloat(n *yaml.Node, v reflect.Value) string {
	tag := n.ShortTag()
	f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
	if n.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") || err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return "expected a number, got " + describe(n)
	}
	v.SetFloat(f)
	return ""
}

// mapping reads a YAML mapping into the struct v. Merge keys (<<) are applied first, in
// reverse order so that earlier sources win, then the mapping's own keys override them.
func (d *decoder) mapping(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.errs.add(n.Line, path, "expected a mapping, got %s", describe(n))
		return
	}
	fields := structFields(v.Type())
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := resolve(n.Content[i]), n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Value == "<<" && k.ShortTag() == "!!merge" {
			d.merge(path, val, v)
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := resolve(n.Content[i]), n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Value == "<<" && k.ShortTag() == "!!merge" {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			d.errs.add(k.Line, path, "a key must be a plain string, got %s", describe(k))
			continue
		}
		fp := joinPath(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			d.errs.always(k.Line, fp, "duplicate key (first set on line %d)", first)
			continue
		}
		seen[k.Value] = k.Line
		idx, ok := fields[k.Value]
		if !ok {
			d.errs.add(k.Line, fp, "unknown field%s", suggest(k.Value, fields))
			continue
		}
		d.lines[fp] = k.Line
		d.value(fp, val, v.Field(idx))
	}
}

// merge applies the value of a << key: a mapping or a list of mappings.
func (d *decoder) merge(path string, val *yaml.Node, v reflect.Value) {
	val = resolve(val)
	switch val.Kind {
	case yaml.MappingNode:
		d.mapping(path, val, v)
	case yaml.SequenceNode:
		for _, m := range slices.Backward(val.Content) {
			d.merge(path, m, v)
		}
	default:
		d.errs.add(val.Line, joinPath(path, "<<"), "a merge key needs a mapping or a list of mappings, got %s", describe(val))
	}
}

// sequence reads a YAML list into the slice v, defaulting each element first.
func (d *decoder) sequence(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind != yaml.SequenceNode {
		d.errs.add(n.Line, path, "expected a list, got %s", describe(n))
		return
	}
	out := reflect.MakeSlice(v.Type(), 0, len(n.Content))
	for i, item := range n.Content {
		ip := fmt.Sprintf("%s[%d]", path, i)
		d.lines[ip] = item.Line
		elem := reflect.New(v.Type().Elem())
		if df, ok := elem.Interface().(defaulter); ok {
			df.setDefaults()
		}
		d.value(ip, item, elem.Elem())
		out = reflect.Append(out, elem.Elem())
	}
	v.Set(out)
}

// structFields maps yaml key → field index for the tagged fields of t.
func structFields(t reflect.Type) map[string]int {
	m := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		tag := t.Field(i).Tag.Get("yaml")
		if tag == "" || tag == "-" {
			continue
		}
		m[tag] = i
	}
	return m
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// suggest returns " (did you mean X?)" for the known field closest to key, if one is close.
func suggest(key string, fields map[string]int) string {
	best, bestDist := "", 3
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names) // deterministic choice between equally close names
	for _, name := range names {
		dist := editDistance(strings.ToLower(key), strings.ToLower(name))
		if dist < bestDist {
			best, bestDist = name, dist
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s?)", best)
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
