package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// fieldError is a problem with a value of the file: Error is the message
// alone, and paths are the keys it is about ("reconnect.min",
// "nodes[0].adapters[1].base_url"), best first, so that the loader can put
// the file's line in front of it.
type fieldError struct {
	paths []string
	err   error
}

func (e *fieldError) Error() string { return e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

// at marks err as being about the value at the first of paths the file
// holds (nil stays nil).
func at(err error, paths ...string) error {
	if err == nil {
		return nil
	}
	return &fieldError{paths: paths, err: err}
}

// atf is at(fmt.Errorf(format, args...), path).
func atf(path, format string, args ...any) error {
	return at(fmt.Errorf(format, args...), path)
}

// locatedError is a problem with its place in the file: "name: line N: "
// (or "name: " when no line is known) in front of the message.
type locatedError struct {
	where string
	err   error
}

func (e *locatedError) Error() string { return e.where + e.err.Error() }
func (e *locatedError) Unwrap() error { return e.err }

// keyLines maps the key paths of a YAML file to the line each is on: the
// key's line for a mapping entry, the item's first line for a list item.
type keyLines map[string]int

// indexLines indexes the key paths of data, best effort: a document that
// does not parse gives an empty index.
func indexLines(data []byte) keyLines {
	var root yaml.Node
	idx := keyLines{}
	if yaml.Unmarshal(data, &root) != nil {
		return idx
	}
	walk(&root, "", func(path string, k, v *yaml.Node) {
		if _, dup := idx[path]; dup {
			return
		}
		if k != nil {
			idx[path] = k.Line
		} else {
			idx[path] = v.Line
		}
	})
	return idx
}

// parentPath drops the last key or index of path: "a.b[2]" → "a.b",
// "a.b" → "a", "a" → "".
func parentPath(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

// line returns the line of the first of paths the file holds; failing that,
// of the nearest enclosing key of the first path that has one.
func (idx keyLines) line(paths []string, usable func(string) bool) int {
	for _, p := range paths {
		if l, ok := idx[p]; ok && usable(p) {
			return l
		}
	}
	for _, p := range paths {
		for p = parentPath(p); p != ""; p = parentPath(p) {
			if l, ok := idx[p]; ok && usable(p) {
				return l
			}
		}
	}
	return 0
}

// locate puts "name: line N: " in front of each problem err holds (or joins)
// that is about a value the file sets, where usable (nil: every path) says
// the value at a path still is the file's. A problem with no line gets
// "name: " when named, else nothing.
func locate(name string, idx keyLines, err error, usable func(string) bool, named bool) error {
	if err == nil {
		return nil
	}
	if usable == nil {
		usable = func(string) bool { return true }
	}
	var errs []error
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		errs = joined.Unwrap()
	} else {
		errs = []error{err}
	}
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		where := ""
		if named {
			where = name + ": "
		}
		var fe *fieldError
		if errors.As(e, &fe) {
			if l := idx.line(fe.paths, usable); l > 0 {
				where = name + ": line " + strconv.Itoa(l) + ": "
			}
		}
		if where == "" {
			out = append(out, e)
			continue
		}
		out = append(out, &locatedError{where: where, err: e})
	}
	return errors.Join(out...)
}

// fieldByPath returns the value at a key path ("reconnect.min") of the
// struct v, following yaml tags (inline structs included).
func fieldByPath(v reflect.Value, path string) (reflect.Value, bool) {
	for _, key := range strings.Split(path, ".") {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			return reflect.Value{}, false
		}
		f, ok := structField(v, key)
		if !ok {
			return reflect.Value{}, false
		}
		v = f
	}
	return v, true
}

func structField(v reflect.Value, key string) (reflect.Value, bool) {
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if opts == "inline" {
			if f, ok := structField(v.Field(i), key); ok {
				return f, true
			}
			continue
		}
		if name == key {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

// quotedString matches a Go-quoted string in a message (%q).
var quotedString = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// entryPaths lists the keys of an entry at base that msg, a message about
// the entry, names (outside its quoted values), in the order it names them.
func entryPaths(base, msg string, keys []string) []string {
	bare := quotedString.ReplaceAllString(msg, `""`)
	type hit struct {
		at  int
		key string
	}
	var hits []hit
	for _, k := range keys {
		if loc := regexp.MustCompile(`\b` + regexp.QuoteMeta(k) + `\b`).FindStringIndex(bare); loc != nil {
			hits = append(hits, hit{loc[0], k})
		}
	}
	// Few keys: an insertion sort keeps the order stable.
	for i := 1; i < len(hits); i++ {
		for j := i; j > 0 && hits[j].at < hits[j-1].at; j-- {
			hits[j], hits[j-1] = hits[j-1], hits[j]
		}
	}
	paths := make([]string, 0, len(hits))
	for _, h := range hits {
		paths = append(paths, base+"."+h.key)
	}
	return paths
}

// yamlKeys lists the yaml keys of struct type t, in field order.
func yamlKeys(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}
