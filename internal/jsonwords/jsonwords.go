// Package jsonwords words encoding/json's decoding errors in a caller's
// terms — the JSON type expected, the value found — never in Go's (type
// names such as nodecmd.RunsArgs mean nothing to whoever sent the JSON).
package jsonwords

import (
	"reflect"
	"strings"
)

// Kind names the JSON type a Go type decodes from.
func Kind(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "a JSON object"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a string or a JSON object" // json.RawMessage, as the API's fields use it
		}
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Pointer:
		return Kind(t.Elem())
	}
	return "a value"
}

// WithArticle turns encoding/json's value words ("array", "number 5") into
// a phrase ("an array", "a number 5").
func WithArticle(v string) string {
	if v == "" {
		return "something else"
	}
	if strings.ContainsRune("aeiou", rune(v[0])) {
		return "an " + v
	}
	return "a " + v
}
