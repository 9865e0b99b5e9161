package config

// WithoutSource returns c without the record of the file it was parsed
// from, to compare with a NodeConfig literal.
func (c NodeConfig) WithoutSource() NodeConfig {
	c.src = nil
	return c
}
