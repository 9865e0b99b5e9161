package config

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// yaml.v3 words some errors in Go's terms ("field x not found in type
// config.TransportConfig", "cannot unmarshal !!seq into uint32"). These
// rewrite them in the file's terms: the key path and the expected type.
var (
	reUnknownField = regexp.MustCompile(`^line (\d+): field (\S+) not found in type \S+$`)
	reWrongType    = regexp.MustCompile(`^line (\d+): cannot unmarshal !!(\w+)(?: ` + "`(.*)`" + `)? into (\S+)$`)
	reLine         = regexp.MustCompile(`^line (\d+): `)
	// reDuration matches Duration.UnmarshalYAML's messages.
	reDuration = regexp.MustCompile(`^line (\d+): (invalid duration ("(?:[^"\\]|\\.)*")|a duration must be)`)
)

// userMessage rewrites one yaml.v3 message about data.
func userMessage(data []byte, msg string) string {
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root) // best effort: only used to name keys
	if m := reUnknownField.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		key := m[2]
		if p := keyPathAt(&root, line, key); p != "" {
			key = p
		}
		return fmt.Sprintf("line %d: unknown key %q", line, key)
	}
	if m := reWrongType.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		want := expectedKind(m[4])
		value := m[3]
		if want == "a list" || want == "a mapping" {
			// A scalar where entries belong is most often a secret
			// written in place of its entry (api_keys: [sk-…], a
			// token as a list item): yaml.v3 quotes up to 10
			// characters of it, the whole of a short token, and the
			// message reaches stderr, the log and a reload's answer.
			value = ""
		}
		where := ""
		if p := valuePathAt(&root, line, m[2]); p != "" {
			where = p + ": "
		}
		return fmt.Sprintf("line %d: %sexpected %s, got %s", line, where, want, yamlKind(m[2], value))
	}
	if m := reDuration.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		if p := durationPathAt(&root, line, m[3]); p != "" {
			return fmt.Sprintf("line %d: %s: %s", line, p, strings.TrimPrefix(msg, "line "+m[1]+": "))
		}
		return msg
	}
	// A syntax error in a file with tabs is almost always the tabs.
	tab := firstTabLine(data)
	if tab == 0 {
		return msg
	}
	const hint = "YAML is indented with spaces, not tabs"
	m := reLine.FindStringSubmatch(msg)
	if m == nil {
		return fmt.Sprintf("line %d: %s (%s)", tab, msg, hint)
	}
	if line, _ := strconv.Atoi(m[1]); line != tab {
		return fmt.Sprintf("%s (%s; the first tab is on line %d)", msg, hint, tab)
	}
	return msg + " (" + hint + ")"
}

func firstTabLine(data []byte) int {
	for i, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, "\t") {
			return i + 1
		}
	}
	return 0
}

// expectedKind names a Go type the way a YAML author thinks of it.
func expectedKind(goType string) string {
	t := strings.TrimLeft(goType, "*")
	switch {
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["):
		return "a mapping"
	case t == "string" || t == "config.Secret":
		return "a string"
	case t == "bool":
		return "true or false"
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case strings.Contains(t, "."):
		return "a mapping"
	}
	return t
}

// yamlKind names a YAML node by its tag, with its value when it is short.
func yamlKind(tag, value string) string {
	kind := map[string]string{"seq": "a list", "map": "a mapping", "str": "a string", "int": "a number",
		"float": "a number", "bool": "a boolean", "null": "nothing", "timestamp": "a timestamp"}[tag]
	if kind == "" {
		kind = "!!" + tag
	}
	if value != "" && len(value) <= 40 {
		kind += " " + strconv.Quote(value)
	}
	return kind
}

// keyPathAt finds the dotted path of the mapping key named key on line.
func keyPathAt(n *yaml.Node, line int, key string) string {
	var found string
	walk(n, "", func(path string, k, _ *yaml.Node) {
		if k != nil && k.Line == line && k.Value == key && found == "" {
			found = path
		}
	})
	return found
}

// valuePathAt finds the path of the deepest value on line whose tag is tag.
func valuePathAt(n *yaml.Node, line int, tag string) string {
	var found string
	walk(n, "", func(path string, _, v *yaml.Node) {
		if v.Line == line && strings.TrimPrefix(v.ShortTag(), "!!") == tag && len(path) >= len(found) {
			found = path
		}
	})
	return found
}

// durationPathAt finds the path of the duration a Duration error on line is
// about: the scalar quoted (as quoted) in the message, or, for a value that
// is no scalar (quoted ""), the deepest list or mapping on line.
func durationPathAt(n *yaml.Node, line int, quoted string) string {
	want, _ := strconv.Unquote(quoted)
	var found string
	walk(n, "", func(path string, _, v *yaml.Node) {
		if v.Line != line {
			return
		}
		switch {
		case quoted != "" && v.Kind == yaml.ScalarNode && v.Value == want && found == "":
			found = path
		case quoted == "" && (v.Kind == yaml.SequenceNode || v.Kind == yaml.MappingNode) && len(path) >= len(found):
			found = path
		}
	})
	return found
}

// walk calls fn for every value under n with its path ("nodes[0].id") and
// its mapping key node (nil for list items and the root).
func walk(n *yaml.Node, path string, fn func(path string, key, value *yaml.Node)) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			walk(c, path, fn)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			fn(p, k, v)
			walk(v, p, fn)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			fn(p, nil, c)
			walk(c, p, fn)
		}
	}
}
