package config

import (
	"encoding/hex"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// LoadEdgeReload is LoadEdge for a reload of the running edge: it also
// refuses a file with no settings at all (empty, blank or comments only).
// The edge starts on such a file, with no nodes; at a reload it is most
// likely a file caught while being written (truncated, then filled: a
// shell's >, a config tool's copy), or a pipe the edge read at start
// (--config <(envsubst < edge.yaml)), which reads empty from then on; and
// applying it would disconnect every node and end their running history
// rows as node_removed. Removing every node is written nodes: [].
func LoadEdgeReload(path string) (*EdgeConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read edge config: %w", err)
	}
	if emptyYAML(data) {
		return nil, fmt.Errorf("%s: the file is empty or holds only comments (one being written, or a pipe such as --config <(…) that was read at start); "+
			"the running config stays in force: to remove every node, write nodes: []", path)
	}
	return ParseEdge(path, data)
}

// emptyYAML reports whether data is a YAML document with no content: a
// file ParseEdge reads as all defaults.
func emptyYAML(data []byte) bool {
	var n yaml.Node
	if err := yaml.Unmarshal(data, &n); err != nil {
		return false // ParseEdge reports it
	}
	return isEmptyDocument(&n)
}

// RestartKeys names the settings outside nodes[] whose value in next differs
// from c's, as dotted edge.yaml keys in EdgeConfig's order
// ("transport.max_frame_size", "http.api_keys"). The edge reads them once,
// at start: a reload applies nodes[] only, so these take effect after a
// restart. Only the names are returned, never the values (http.api_keys
// holds key hashes and the names of the variables holding keys). A setting written another way to
// the same effect is no change (see settings).
func (c *EdgeConfig) RestartKeys(next *EdgeConfig) []string {
	var keys []string
	diffKeys("", reflect.ValueOf(c.settings()), reflect.ValueOf(next.settings()), &keys)
	return keys
}

// settings is c as the edge runs on it, for RestartKeys: what is written
// differently but acts the same compares equal, so a reload does not ask
// for a restart (which drops every node link) that would change nothing.
// log.access left out is access: true; an API key given by key_env, or by
// its key_sha256 in upper case or with the "sha256:" prefix, is its digest
// in lower-case hex (as a node's token and its token_sha256 are one token
// to a reload); the order of http.api_keys, and of a key's scopes and
// nodes, is no setting (a key is found by its digest, a scope or node by
// being listed), nor the order, case or final dot of transport.tls.hosts
// (the certificate covers a set of names).
func (c *EdgeConfig) settings() EdgeConfig {
	s := *c
	access := c.Log.AccessLog()
	s.Log.Access = &access
	if len(c.HTTP.APIKeys) > 0 {
		s.HTTP.APIKeys = make([]APIKeyEntry, len(c.HTTP.APIKeys))
		for i, k := range c.HTTP.APIKeys {
			if sum, err := k.ResolveKeyHash(); err == nil {
				k.KeySHA256, k.KeyEnv = hex.EncodeToString(sum[:]), ""
			}
			k.Scopes, k.Nodes = sortedSet(k.Scopes), sortedSet(k.Nodes)
			s.HTTP.APIKeys[i] = k
		}
		slices.SortStableFunc(s.HTTP.APIKeys, func(a, b APIKeyEntry) int { return strings.Compare(a.Name, b.Name) })
	}
	if len(c.Transport.TLS.Hosts) > 0 {
		// The certificate covers a set of names, as CertHosts reads them.
		hosts := make([]string, len(c.Transport.TLS.Hosts))
		for i, h := range c.Transport.TLS.Hosts {
			hosts[i] = certHostName(h)
		}
		s.Transport.TLS.Hosts = sortedSet(hosts)
	}
	return s
}

// sortedSet is a sorted copy of list without repeats; nil when it is empty
// (nodes: ~ is no nodes limit, as leaving it out is; nodes: [] is refused).
func sortedSet(list []string) []string {
	if len(list) == 0 {
		return nil
	}
	out := slices.Clone(list)
	slices.Sort(out)
	return slices.Compact(out)
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
