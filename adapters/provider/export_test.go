package provider

// IdleConns is the number of pooled lean-path connections to hostport.
func IdleConns(c *Client, hostport string) int {
	if c.lean == nil {
		return 0
	}
	return c.lean.idleCount(hostport)
}
