package provider

// IdleConns is the number of pooled lean-path connections to hostport.
func IdleConns(c *Client, hostport string) int {
	if c.lean == nil {
		return 0
	}
	return c.lean.idleCount(hostport)
}

// StripResponseHeader is the in-place CleanResponseHeader Do uses.
var StripResponseHeader = stripResponseHeader
