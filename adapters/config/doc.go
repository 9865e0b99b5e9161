// Package config loads the YAML configuration of the edge (edge.yaml) and of
// the node (an optional node-local file), and serves the edge's node directory.
//
// Files are decoded strictly: an unknown or misspelt field is an error that
// names the file and line, never a silently ignored setting. Parsing applies
// defaults; Validate checks the values. Tokens are held as Secret so that
// printing a config never reveals them, and no error of this package contains
// a token.
package config
