package config

import (
	"reflect"
	"strings"
)

// RestartKeys names the settings outside nodes[] whose value in next differs
// from c's, as dotted edge.yaml keys in the file's order ("http.api_keys",
// "transport.max_frame_size"). The edge reads them once, at start: a reload
// applies nodes[] only, so these take effect after a restart. Only the names
// are returned, never the values (http.api_keys holds key hashes and the
// names of the variables holding keys).
func (c *EdgeConfig) RestartKeys(next *EdgeConfig) []string {
	var keys []string
	diffKeys("", reflect.ValueOf(*c), reflect.ValueOf(*next), &keys)
	return keys
}

// diffKeys appends to keys the yaml key of every field of the structs a and
// b that differs, recursing into nested structs (a pointer, a list or a map
// is one setting). nodes[] is left out: a reload applies it.
func diffKeys(prefix string, a, b reflect.Value, keys *[]string) {
	t := a.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		key := prefix + name
		if key == "nodes" {
			continue
		}
		av, bv := a.Field(i), b.Field(i)
		if f.Type.Kind() == reflect.Struct {
			diffKeys(key+".", av, bv, keys)
			continue
		}
		if !sameSetting(av, bv) {
			*keys = append(*keys, key)
		}
	}
}

// sameSetting compares two values of one setting; an empty list or map is
// the same as none.
func sameSetting(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Slice, reflect.Map:
		if a.Len() == 0 && b.Len() == 0 {
			return true
		}
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}
