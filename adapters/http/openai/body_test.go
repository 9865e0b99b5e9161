package openaiapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

// oneByte hands out one byte per Read, the worst split of a body.
type oneByte struct{ r io.Reader }

func (o oneByte) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return o.r.Read(p[:1])
}

func TestScanJSONModel(t *testing.T) {
	deepArr := `{"x":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `,"model":"m"}`
	okDepth := `{"x":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `,"model":"m"}`
	cases := []struct {
		name, body string
		keys       []string
		want       string
		err        string
	}{
		{"first", `{"model":"qwen","messages":[]}`, modelKeys, "qwen", ""},
		{"last", `{"messages":[{"role":"user","content":"a \"quoted\" } ] {"}],"n":1,"t":true,"z":null,"model":"qwen"}`, modelKeys, "qwen", ""},
		{"escaped value", `{"model":"a\u00e9\"b"}`, modelKeys, "aé\"b", ""},
		{"whitespace", " \n{ \"temperature\" : 0.5 ,\t\"model\" :\r\n \"m\" }", modelKeys, "m", ""},
		{"nested model key ignored", `{"meta":{"model":"inner"},"model":"outer"}`, modelKeys, "outer", ""},
		{"legacy name", `{"name":"llama3.2","stream":false}`, ollamaKeys, "llama3.2", ""},
		{"other case", `{"MODEL":"m"}`, modelKeys, "m", ""},
		{"escaped key", `{"name":"llama3.2","mod\u0065l":"other"}`, ollamaKeys, "other", ""},
		{"legacy name, other case", `{"Name":"llama3.2"}`, ollamaKeys, "llama3.2", ""},
		{"model beats name", `{"name":"a","model":"b"}`, ollamaKeys, "b", ""},
		{"empty model falls back to name", `{"model":"","name":"a"}`, ollamaKeys, "a", ""},
		{"none", `{"prompt":"x","n":2}`, modelKeys, "", ""},
		{"empty object", `{}`, modelKeys, "", ""},
		{"scalar last", `{"model":"m2","n":12}`, []string{"n", "model"}, "", "must be a string"},
		{"depth within limit", okDepth, modelKeys, "m", ""},
		{"too deep array", deepArr, modelKeys, "", "deeper than 128"},
		{"too deep objects", strings.Repeat(`{"a":`, 300), modelKeys, "", "deeper than 128"},
		{"not an object", `["model"]`, modelKeys, "", "not a JSON object"},
		{"truncated", `{"messages":[1,2`, modelKeys, "", "ended before"},
		{"mismatched", `{"x":[1,2},"model":"m"}`, modelKeys, "", "mismatched"},
		{"model not a string", `{"model":7}`, modelKeys, "", "must be a string"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, split := range []bool{false, true} {
				var src io.Reader = strings.NewReader(c.body)
				if split {
					src = oneByte{src}
				}
				p := &prefix{src: src}
				got, _, err := scanJSONModel(p, c.keys, "")
				if c.err != "" {
					if err == nil || !strings.Contains(err.Error(), c.err) {
						t.Fatalf("split=%v: err = %v, want %q", split, err, c.err)
					}
					continue
				}
				if err != nil || got != c.want {
					t.Fatalf("split=%v: got %q, %v; want %q", split, got, err, c.want)
				}
				// What was read plus the rest is the body, byte for byte.
				all := relayed(p)
				if string(all) != c.body {
					t.Fatalf("split=%v: relayed %q, want %q", split, all, c.body)
				}
			}
		})
	}
}

// TestScanJSONModelAlso: asked for another top-level key too
// (previous_response_id), the scan reads on past the model until it has
// that key or the object ends, and stops once it has both.
func TestScanJSONModelAlso(t *testing.T) {
	const prev = "previous_response_id"
	cases := []struct {
		name, body  string
		model, also string
		rest        string // what the scan must leave unread
		err         string
	}{
		{"model first", `{"model":"m","input":"hi","previous_response_id":"resp_1","store":true}`, "m", "resp_1", `,"store":true}`, ""},
		{"id first", `{"previous_response_id":"resp_1","model":"m","input":"hi"}`, "m", "resp_1", `,"input":"hi"}`, ""},
		{"absent: the whole body", `{"model":"m","input":[{"previous_response_id":"nested"}]}`, "m", "", "", ""},
		{"null", `{"model":"m","previous_response_id":null,"input":"hi"}`, "m", "", `ull,"input":"hi"}`, ""},
		{"null first", `{"previous_response_id":null,"model":"m","input":"hi"}`, "m", "", `,"input":"hi"}`, ""},
		{"other case", `{"model":"m","Previous_Response_Id":"resp_1"}`, "m", "resp_1", `}`, ""},
		{"no model", `{"previous_response_id":"resp_1"}`, "", "resp_1", "", ""},
		{"not a string", `{"model":"m","previous_response_id":7}`, "", "", "", `"previous_response_id" must be a string`},
		{"too long", `{"model":"m","previous_response_id":"` + strings.Repeat("r", maxModel) + `"}`, "", "", "", `"previous_response_id" is longer than`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &prefix{src: oneByte{strings.NewReader(c.body)}}
			model, also, err := scanJSONModel(p, modelKeys, prev)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || model != c.model || also != c.also {
				t.Fatalf("got %q, %q, %v; want %q, %q", model, also, err, c.model, c.also)
			}
			if rest, _ := io.ReadAll(p.src); string(rest) != c.rest {
				t.Fatalf("left %q unread, want %q", rest, c.rest)
			}
		})
	}
	// Without also, the scan still stops at the model.
	p := &prefix{src: oneByte{strings.NewReader(`{"model":"m","previous_response_id":"resp_1"}`)}}
	if model, also, err := scanJSONModel(p, modelKeys, ""); err != nil || model != "m" || also != "" {
		t.Fatalf("got %q, %q, %v", model, also, err)
	}
	if rest, _ := io.ReadAll(p.src); string(rest) != `,"previous_response_id":"resp_1"}` {
		t.Fatalf("left %q unread", rest)
	}
}

// countingReader serves a body of n bytes built from a repeated pattern
// without holding it, and counts what was read.
type countingReader struct {
	head, unit []byte
	n, read    int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.read >= c.n {
		return 0, io.EOF
	}
	i := 0
	for i < len(p) && c.read < c.n {
		if c.read < int64(len(c.head)) {
			p[i] = c.head[c.read]
		} else {
			p[i] = c.unit[(c.read-int64(len(c.head)))%int64(len(c.unit))]
		}
		i++
		c.read++
	}
	return i, nil
}

func TestHostileNestingIsRefusedEarly(t *testing.T) {
	for _, form := range []struct{ head, unit string }{{`{"x":`, "["}, {`{"a":`, `{"a":`}} {
		src := &countingReader{head: []byte(form.head), unit: []byte(form.unit), n: 60 << 20}
		p := &prefix{src: src}
		_, _, err := scanJSONModel(p, modelKeys, "")
		if !errors.Is(err, errTooDeep) {
			t.Fatalf("%s…: err = %v", form.unit, err)
		}
		if src.read > blockSize {
			t.Fatalf("%s…: read %d bytes of a 60 MB body before refusing it", form.unit, src.read)
		}
	}
}

func TestScanMultipartModel(t *testing.T) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	fw, _ := mw.CreateFormFile("file", "a.wav")
	fw.Write(bytes.Repeat([]byte{0, 1, 2, '-', '-', '\r', '\n'}, 50000))
	mw.WriteField("response_format", "json")
	mw.WriteField("model", "whisper-1")
	mw.WriteField("language", "en")
	mw.Close()
	body := b.Bytes()
	p := &prefix{src: oneByte{bytes.NewReader(body)}}
	got, err := scanMultipartModel(p, mw.FormDataContentType(), "model")
	if err != nil || got != "whisper-1" {
		t.Fatalf("got %q, %v", got, err)
	}
	all := relayed(p)
	if !bytes.Equal(all, body) {
		t.Fatalf("relayed %d bytes, want the %d of the body", len(all), len(body))
	}
	if _, err := scanMultipartModel(&prefix{src: strings.NewReader("x")}, "application/json", "model"); err == nil {
		t.Fatal("a non-multipart body was accepted")
	}
	var nb bytes.Buffer
	mw2 := multipart.NewWriter(&nb)
	mw2.WriteField("language", "en")
	mw2.Close()
	if got, err := scanMultipartModel(&prefix{src: &nb}, mw2.FormDataContentType(), "model"); err != nil || got != "" {
		t.Fatalf("form without model: %q, %v", got, err)
	}
}

// A body is kept whole and in order whatever its declared length says of
// the blocks: one block of its size when declared, growing blocks when not.
func TestPrefixBlocks(t *testing.T) {
	small := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	big := `{"messages":"` + strings.Repeat("x", 300<<10) + `","model":"m"}`
	for _, c := range []struct {
		name   string
		body   string
		length int64
		blocks int // after the body was read to its end
	}{
		{"small declared", small, int64(len(small)), 1},
		{"small unknown", small, -1, 1},
		{"big declared", big, int64(len(big)), 0},
		{"big unknown", big, -1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPrefix(oneByteEvery(strings.NewReader(c.body), 7000), c.length)
			if got, _, err := scanJSONModel(p, modelKeys, ""); err != nil || got != "m" {
				t.Fatalf("got %q, %v", got, err)
			}
			for p.more() != nil {
			}
			for i, b := range p.blocks {
				if cap(b) > blockSize {
					t.Fatalf("block %d holds %d bytes, more than %d", i, cap(b), blockSize)
				}
			}
			if c.blocks > 0 && len(p.blocks) != c.blocks {
				t.Fatalf("%d blocks, want %d", len(p.blocks), c.blocks)
			}
			if c.length > 0 && c.length < blockSize && cap(p.blocks[0]) != int(c.length)+1 {
				t.Fatalf("first block of %d bytes for a declared %d", cap(p.blocks[0]), c.length)
			}
			all := relayed(p)
			if string(all) != c.body {
				t.Fatalf("relayed %d bytes, want the %d of the body", len(all), len(c.body))
			}
		})
	}
}

// oneByteEvery reads at most n bytes per Read.
func oneByteEvery(r io.Reader, n int) io.Reader { return readAtMost{r, n} }

type readAtMost struct {
	r io.Reader
	n int
}

func (r readAtMost) Read(p []byte) (int, error) { return r.r.Read(p[:min(len(p), r.n)]) }

// BenchmarkScanJSONModel routes a small chat request body as the handler
// does (scan for the model, then read the small body whole): "64KiB-block"
// is the prefix as it was (a 64 KiB first block per request), "declared"
// a body with Content-Length, "unknown" a chunked one.
func BenchmarkScanJSONModel(b *testing.B) {
	body := []byte(`{"model":"chat","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	for _, c := range []struct {
		name   string
		length int64
	}{{"64KiB-block", blockSize}, {"declared", int64(len(body))}, {"unknown", -1}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			r := bytes.NewReader(body)
			for b.Loop() {
				r.Reset(body)
				p := newPrefix(r, c.length)
				if m, _, err := scanJSONModel(p, modelKeys, ""); err != nil || m != "chat" {
					b.Fatal(m, err)
				}
				for p.more() != nil {
				}
				if head, _ := p.body(); len(head) != len(body) {
					b.Fatal(len(head))
				}
			}
		})
	}
}

// BenchmarkKeyGuard passes a chat request body through the guard every
// /v1/chat/completions and /v1/responses body goes through: it matches each
// top-level key against the routing keys and the route's other key.
func BenchmarkKeyGuard(b *testing.B) {
	body := []byte(`{"model":"chat","stream":true,"stream_options":{"include_usage":true},"temperature":0.2,` +
		`"messages":[{"role":"user","content":"hi"}],"max_tokens":64}`)
	b.ReportAllocs()
	r := bytes.NewReader(body)
	for b.Loop() {
		r.Reset(body)
		if n, err := io.Copy(io.Discard, newKeyGuard(r, modelKeys, "previous_response_id")); err != nil || n != int64(len(body)) {
			b.Fatal(n, err)
		}
	}
}

// relayed is what a prefix relays: the bytes read so far, then the rest.
func relayed(p *prefix) []byte {
	head, rest := p.body()
	all := append([]byte(nil), head...)
	if rest != nil {
		b, _ := io.ReadAll(rest)
		all = append(all, b...)
	}
	return all
}

// TestKeyGuard: a routing key, or the route's other key (also), named twice
// at the top level fails the read, whatever its spelling; nested keys,
// values and other keys do not count.
func TestKeyGuard(t *testing.T) {
	const prev = "previous_response_id"
	for _, c := range []struct {
		body string
		keys []string
		dup  string
		also string
	}{
		{`{"model":"a","messages":[{"model":"x","content":"{\"model\":1}"}]}`, []string{"model"}, "", ""},
		{`{"model":"a","model":"b"}`, []string{"model"}, "model", ""},
		{`{"model":"a",  "model" : "b"}`, []string{"model"}, "model", ""},
		{`{"model":"a","mod\u0065l":"b"}`, []string{"model"}, "model", ""},
		{`{"\u006d\u006f\u0064\u0065\u006c":"a","model":"b"}`, []string{"model"}, "model", ""},
		{`{"model":"a","name":"a"}`, []string{"model", "name"}, "", ""},
		{`{"model":"","name":"b"}`, []string{"model", "name"}, "", ""},
		{`{"name":"b","model":""}`, []string{"model", "name"}, "", ""},
		{`{"model":"a","name":{"x":"b"},"y":["b"]}`, []string{"model", "name"}, "", ""},
		{`{"model":"a","n":"b","name":7}`, []string{"model", "name"}, "", ""},
		{`{"model":"a","name":"b"}`, []string{"model", "name"}, "name", ""},
		{`{"name":"llama3.2","mod\u0065l":"undeclared-70b"}`, []string{"model", "name"}, "model", ""},
		{`{"model":"a","MODEL":"b"}`, []string{"model"}, "model", ""},
		{`{"Model":"a","model":"b"}`, []string{"model"}, "model", ""},
		{`{"name":"a","NaMe":"a"}`, []string{"model", "name"}, "name", ""},
		{`{"source":"a","\u017fource":"b"}`, []string{"source"}, "source", ""}, // ſ folds to s in Go
		{`{"source":"a","ſource":"b"}`, []string{"source"}, "source", ""},
		{`{"name":"a","stream":true,"name":"b"}`, []string{"model", "name"}, "name", ""},
		{`{"a":"model","model":"x","b":["model","model"]}`, []string{"model"}, "", ""},
		{`{"a":{"model":1,"model":2},"model":"x"}`, []string{"model"}, "", ""},
		{`{"a":"}\"{,","model":"x","b":"\\"}`, []string{"model"}, "", ""},
		{`{"model":"a","previous_response_id":"r1","input":[{"previous_response_id":"r2"}]}`, []string{"model"}, "", prev},
		{`{"previous_response_id":"r1","model":"a","previous_response_id":"r2"}`, []string{"model"}, prev, prev},
		{`{"previous_response_id":null,"model":"a","Previous_Response_ID":"r2"}`, []string{"model"}, prev, prev},
		{`{"previous_response_id":"r1","previous_response_id":"r2"}`, []string{"model"}, "", ""}, // not a key of this route
		// Spelled entirely in \u escapes (120 bytes): still the key.
		{`{"previous_response_id":"r1","model":"a","` + escapeAll(prev) + `":"r2"}`, []string{"model"}, prev, prev},
		{`{"model":"a","` + escapeAll("model") + `":"b"}`, []string{"model"}, "model", ""},
	} {
		for _, chunk := range []int{1, 7, 1 << 10} { // split anywhere
			g := newKeyGuard(iotest.OneByteReader(strings.NewReader(c.body)), c.keys, c.also)
			if chunk > 1 {
				g = newKeyGuard(&chunked{r: strings.NewReader(c.body), n: chunk}, c.keys, c.also)
			}
			got, err := io.ReadAll(g)
			switch {
			case c.dup == "" && err != nil:
				t.Fatalf("%s (reads of %d): %v", c.body, chunk, err)
			case c.dup == "" && string(got) != c.body:
				t.Fatalf("%s (reads of %d): passed %q", c.body, chunk, got)
			case c.dup != "" && (err == nil || !strings.Contains(err.Error(), strconv.Quote(c.dup))):
				t.Fatalf("%s (reads of %d): err %v, want %q named twice", c.body, chunk, err, c.dup)
			case c.dup != "" && len(got) >= len(c.body):
				t.Fatalf("%s (reads of %d): the whole body passed", c.body, chunk)
			}
		}
	}
}

// escapeAll spells every character of s as a \u escape, as JSON allows.
func escapeAll(s string) string {
	var b strings.Builder
	for _, r := range s {
		fmt.Fprintf(&b, `\u%04x`, r)
	}
	return b.String()
}

// TestRoutingKeysFitMaxKey: every key a route reads fits the scan's and
// the guard's key bound when spelled entirely in escapes (6 bytes a
// character); a longer one would be skipped, so a caller could hide it.
func TestRoutingKeysFitMaxKey(t *testing.T) {
	for _, k := range append(append(append(slices.Clone(modelKeys), ollamaKeys...), copyKeys...), followsKey) {
		if e := escapeAll(k); len(e) > maxKey {
			t.Errorf("routing key %q escaped is %d bytes, over maxKey %d", k, len(e), maxKey)
		}
	}
}

// The follow-up key spelled entirely in escapes is read as the key: a
// caller cannot route a follow-up past the edge's ownership check by
// escaping it.
func TestScanFindsAnEscapedFollowsKey(t *testing.T) {
	body := `{"model":"m","` + escapeAll(followsKey) + `":"resp_1","input":"x"}`
	for _, split := range []bool{false, true} {
		var src io.Reader = strings.NewReader(body)
		if split {
			src = oneByte{src}
		}
		model, also, err := scanJSONModel(&prefix{src: src}, modelKeys, followsKey)
		if err != nil || model != "m" || also != "resp_1" {
			t.Fatalf("split=%v: scan = %q, %q, %v; want m, resp_1", split, model, also, err)
		}
	}
}

// chunked reads at most n bytes at a time.
type chunked struct {
	r io.Reader
	n int
}

func (c *chunked) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

// TestFormGuard: a second non-file "model" form field fails the read,
// whatever the line endings, header folding or case; other forms pass.
func TestFormGuard(t *testing.T) {
	const ct = `multipart/form-data; boundary="xyz"`
	part := func(disposition, value string) string {
		return "--xyz\r\nContent-Disposition: " + disposition + "\r\n\r\n" + value + "\r\n"
	}
	for _, c := range []struct {
		name, body, err string
	}{
		{"once", part(`form-data; name="model"`, "a") + part(`form-data; name="file"; filename="model"`, "--xy\r\n--xyz-") + "--xyz--\r\n", ""},
		{"file named model", part(`form-data; name="model"`, "a") + part(`form-data; name="model"; filename="a.wav"`, "RIFF") + "--xyz--\r\n", ""},
		{"model in a value", part(`form-data; name="model"`, "a") + part(`form-data; name="prompt"`, "Content-Disposition: form-data; name=\"model\"\r\n") + "--xyz--\r\n", ""},
		{"twice", part(`form-data; name="model"`, "a") + part(`form-data; name="model"`, "b") + "--xyz--\r\n", "more than once"},
		{"other case", part(`form-data; name="model"`, "a") + part(`form-data; name="MODEL"`, "b"), "more than once"},
		{"LF only, header case", "--xyz\nContent-Disposition: form-data; name=model\n\na\n--xyz\ncontent-disposition: form-data; name=\"model\"\n\nb\n", "more than once"},
		{"folded header", part(`form-data; name="model"`, "a") + "--xyz  \r\nContent-Type: text/plain\r\nContent-Disposition: form-data;\r\n name=\"model\"\r\n\r\nb\r\n", "more than once"},
		{"after the closing boundary", part(`form-data; name="model"`, "a") + "--xyz--\r\n" + part(`form-data; name="model"`, "b"), "more than once"},
		{"malformed disposition", part(`form-data; name="model`, "a"), "malformed"},
		{"huge headers", "--xyz\r\nX: " + strings.Repeat("a", maxPartHeader), "longer than"},
	} {
		for _, chunk := range []int{1, 7, 1 << 10} {
			g := newFormGuard(&chunked{r: strings.NewReader(c.body), n: chunk}, ct)
			got, err := io.ReadAll(g)
			switch {
			case c.err == "" && (err != nil || string(got) != c.body):
				t.Fatalf("%s (reads of %d): %v, passed %d of %d bytes", c.name, chunk, err, len(got), len(c.body))
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("%s (reads of %d): err %v, want %q", c.name, chunk, err, c.err)
			case c.err != "" && len(got) >= len(c.body):
				t.Fatalf("%s (reads of %d): the whole body passed", c.name, chunk)
			}
		}
	}
}

// TestPlainJSONString: the guard's shortcut for a model value decodes what
// json.Unmarshal decodes, and leaves every string that needs the decoder
// (escapes, non-ASCII, control bytes, a missing quote) to it.
func TestPlainJSONString(t *testing.T) {
	for _, q := range []string{`""`, `"chat"`, `"llama3.1:8b-instruct"`, `"a b/c~"`, "\"\x7f\""} {
		got, ok := plainJSONString([]byte(q))
		var want string
		if err := json.Unmarshal([]byte(q), &want); err != nil || !ok || got != want {
			t.Errorf("%s: plain %q %v, json %q %v", q, got, ok, want, err)
		}
	}
	for _, q := range []string{`"mod\u0065l"`, `"a\"b"`, "\"caf\xc3\xa9\"", "\"\xff\"", "\"a\tb\"", `"open`, `x`, `"`, `chat"`} {
		if got, ok := plainJSONString([]byte(q)); ok {
			t.Errorf("%s: plain took it as %q", q, got)
		}
	}
}
