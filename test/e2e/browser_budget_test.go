package e2e

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"iop/adapters/transport"
)

// TestWebPageCannotKeepNodesFromRegistering: any web page the operator
// opens can make the browser send requests to the edge's transport port,
// from the browser's own address, which is the address of a node on the
// same machine (make run) or of every node behind the same NAT. A real
// Chromium on a page of another origin fetches the transport port twenty
// times a second, over http:// (plain HTTP to the TLS port) and https://
// (a TLS handshake whose certificate the browser refuses), and names it as
// the TURN server of WebRTC connections five times a second, over turn:
// (STUN over TCP) and turns: (TLS). A node's handshake from the same
// address still goes through every time, and the node registers: those
// requests guess no token and are not charged to the address's budget of
// failed registrations.
func TestWebPageCannotKeepNodesFromRegistering(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	e := startEdge(t, defaultNodes(4))
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><title>any page</title><script>
window.sent = 0; window.settled = 0;
function hit(url) {
  window.sent++;
  fetch(url, {method: 'POST', mode: 'no-cors', body: 'x'}).catch(() => {}).finally(() => window.settled++);
}
setInterval(() => { hit('http://%[1]s/'); hit('https://%[1]s/'); }, 50);
window.turns = 0;
async function turn(url) {
  const pc = new RTCPeerConnection({iceServers: [{urls: url, username: 'u', credential: 'p'}], iceTransportPolicy: 'relay'});
  pc.createDataChannel('x');
  await pc.setLocalDescription(await pc.createOffer());
  window.turns++;
  setTimeout(() => pc.close(), 3000);
}
setInterval(() => { turn('turn:%[1]s?transport=tcp'); turn('turns:%[1]s?transport=tcp'); }, 200);
</script>`, e.transport)
	}))
	t.Cleanup(page.Close)
	b.do(15*time.Second, "open the page", chromedp.Navigate(page.URL))
	// The budget (10) is spent several times over before the node starts.
	b.waitJS(15*time.Second, "the page's requests settle", "window.settled >= 60 && window.turns >= 10")
	if !strings.Contains(e.out.String(), "node handshake failed") {
		t.Fatalf("the page's requests did not reach the transport port; edge output:\n%s", e.out.String())
	}
	// While the page keeps at it, a node's TLS handshake from the same
	// address goes through every time: the address is never throttled (a
	// throttled address is closed at accept, before the handshake).
	cfg, err := transport.NewClientTLS(transport.ClientTLS{CAPin: e.pin}, e.transport)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		settled := evalJS[float64](b, "window.settled")
		b.waitJS(15*time.Second, "more of the page's requests settle", fmt.Sprintf("window.settled >= %v", settled+4))
		nc, err := net.DialTimeout("tcp", e.transport, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(nc, cfg)
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		err = tc.Handshake()
		_ = nc.Close()
		if err != nil {
			t.Fatalf("probe %d: the address of the browser was refused: %v", i, err)
		}
	}
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
}
