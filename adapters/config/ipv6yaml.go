package config

import (
	"fmt"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// An IPv6 address written in YAML without quotes ("listen: [::1]:7700")
// is a syntax error, as "[" starts a list; yaml.v3 reports it as "did not
// find expected node content" with a line that is one too low, or none on
// the first line. These find such addresses so that the error can name
// their line and show the quoted form.
var (
	// reBracketAddr is a bracketed host (two colons in it, or a port after
	// it): "[::1]", "[::1]:7700", "[fe80::1%eth0]:7700", "[127.0.0.1]:80".
	reBracketAddr = regexp.MustCompile(`\[(?:[0-9A-Za-z.%_-]*:[0-9A-Za-z.%_-]*:[0-9A-Za-z:.%_-]*\](?::[0-9]+)?|[0-9A-Za-z:.%_-]*\]:[0-9]+)`)
	// reAddrList is a flow list with an IPv6 address among its items:
	// "[::1, fe80::1]".
	reAddrList = regexp.MustCompile(`\[[^\[\]{}#"'\\]*::[^\[\]{}#"'\\]*\]`)
)

// unquotedAddr is one such value: its 1-based line, the text as written and
// as it should be written.
type unquotedAddr struct {
	line        int
	text, fixed string
}

// findUnquotedAddrs returns the unquoted bracketed addresses of data, and
// data with each of them quoted.
func findUnquotedAddrs(data []byte) ([]unquotedAddr, []byte) {
	lines := strings.Split(string(data), "\n")
	var found []unquotedAddr
	for i, l := range lines {
		code := l
		if j := strings.Index(code, " #"); j >= 0 {
			code = code[:j]
		}
		// A value in quotes is left alone: only text outside quotes counts.
		if strings.ContainsAny(code, `"'`) || strings.HasPrefix(strings.TrimSpace(code), "#") {
			continue
		}
		loc := reAddrList.FindStringIndex(code)
		fixed := ""
		if loc != nil && !reBracketAddr.MatchString(code[loc[0]:loc[1]]) {
			items := strings.Split(code[loc[0]+1:loc[1]-1], ",")
			for k, it := range items {
				items[k] = `"` + strings.TrimSpace(it) + `"`
			}
			fixed = "[" + strings.Join(items, ", ") + "]"
		} else if loc = reBracketAddr.FindStringIndex(code); loc != nil {
			fixed = `"` + code[loc[0]:loc[1]] + `"`
		} else {
			continue
		}
		// Only a value: after "key: ", "- " or the start of a flow item.
		before := strings.TrimRight(code[:loc[0]], " ")
		if before != "" && !strings.HasSuffix(before, ":") && !strings.HasSuffix(before, "-") &&
			!strings.HasSuffix(before, "{") && !strings.HasSuffix(before, ",") {
			continue
		}
		found = append(found, unquotedAddr{line: i + 1, text: code[loc[0]:loc[1]], fixed: fixed})
		lines[i] = l[:loc[0]] + fixed + l[loc[1]:]
	}
	return found, []byte(strings.Join(lines, "\n"))
}

// unquotedAddrErrors explains the syntax error yamlErr of data if quoting
// bracketed addresses makes it go away (or moves it): one line per address,
// "line N: path: ... must be quoted ...". It returns nil when that is not
// the cause.
func unquotedAddrErrors(data []byte, yamlErr error) []string {
	found, fixed := findUnquotedAddrs(data)
	if len(found) == 0 {
		return nil
	}
	var root yaml.Node
	fixedErr := yaml.Unmarshal(fixed, &root)
	if fixedErr != nil && fixedErr.Error() == yamlErr.Error() {
		return nil
	}
	out := make([]string, len(found))
	for i, f := range found {
		where := ""
		if fixedErr == nil {
			if p := addrPathAt(&root, f.line, f.fixed); p != "" {
				where = p + ": "
			}
		}
		why := `YAML reads "[" as the start of a list`
		if strings.HasPrefix(f.fixed, "[") {
			why = `YAML cannot read an address with "::" in a [ ] list`
		}
		out[i] = fmt.Sprintf("line %d: %s%s must be quoted: write %s (unquoted, %s)", f.line, where, f.text, f.fixed, why)
	}
	return out
}

// addrPathAt finds the path of the value on line that fixed, the quoted
// form of an address, decodes to.
func addrPathAt(n *yaml.Node, line int, fixed string) string {
	want := fixed
	if strings.HasPrefix(fixed, `"`) {
		want = strings.Trim(fixed, `"`)
	}
	var found string
	walk(n, "", func(path string, _, v *yaml.Node) {
		if v.Line != line || found != "" {
			return
		}
		if (v.Kind == yaml.ScalarNode && v.Value == want) || (v.Kind == yaml.SequenceNode && !strings.HasPrefix(fixed, `"`)) {
			found = path
		}
	})
	return found
}
