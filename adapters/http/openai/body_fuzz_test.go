package openaiapi

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"strings"
	"testing"
)

// routes are the key sets the handler scans bodies with (handler.go).
var fuzzRoutes = []struct {
	keys []string
	also string
}{
	{modelKeys, ""},
	{ollamaKeys, ""},
	{modelKeys, "previous_response_id"},
	{[]string{"source"}, ""},
}

// FuzzScanJSONModel reads arbitrary bodies as the handler does (the key
// guard under the prefix, the scan, then the relay of the rest). It must
// never panic, must relay the body byte for byte when it accepts it, and
// must never route on a model other than the one Go's encoding/json (a
// provider's parser) reads from a body that reaches the provider whole.
func FuzzScanJSONModel(f *testing.F) {
	for _, s := range []string{
		`{"model":"qwen","messages":[]}`,
		`{"messages":[{"role":"user","content":"a \"quoted\" } ] {"}],"n":1,"t":true,"z":null,"model":"qwen"}`,
		`{"model":"a\u00e9\"b"}`,
		" \n{ \"temperature\" : 0.5 ,\t\"model\" :\r\n \"m\" }",
		`{"meta":{"model":"inner"},"model":"outer"}`,
		`{"model":"a","mod\u0065l":"b"}`,
		`{"Model":"a","model":"b"}`,
		`{"model":"","name":"b"}`,
		`{"name":"llama3.2","mod\u0065l":"undeclared-70b"}`,
		`{"source":"a","\u017fource":"b"}`,
		`{"previous_response_id":null,"model":"a","Previous_Response_ID":"r2"}`,
		`{"model":"gpt-4o","input":"hi","previous_response_id":"resp_1","stream":true}`,
		`{"x":[[{"a":[1,2,{"b":null}]}]],"model":"m","y":-1.5e3}`,
		`{"model":"m"`,
		`[]`,
		`{"model":1}`,
	} {
		for sel := range fuzzRoutes {
			f.Add([]byte(s), uint8(sel), uint8(0))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, sel, split uint8) {
		route := fuzzRoutes[int(sel)%len(fuzzRoutes)]
		var src io.Reader = bytes.NewReader(body)
		if split > 0 {
			src = &chunked{r: src, n: int(split)}
		}
		g := newKeyGuard(src, route.keys, route.also)
		length := int64(len(body))
		if split%2 == 1 {
			length = -1
		}
		p := newPrefix(g, length)
		model, follows, err := scanJSONModel(p, route.keys, route.also)
		if err != nil {
			return
		}
		if !relaysWhole(t, p, body) {
			return // refused: the provider never gets the whole body
		}
		if model == "" || !json.Valid(body) {
			return // refused, or the provider refuses the body
		}
		if body[bytes.IndexFunc(body, func(r rune) bool { return !strings.ContainsRune(" \t\r\n", r) })] != '{' {
			t.Fatalf("routed %q on a body that is no object: %q", model, body)
		}
		var v map[string]any
		// What a Go provider binds: fields matched case-insensitively, the
		// last of duplicates winning.
		var got struct {
			Model  *string `json:"model"`
			Name   *string `json:"name"`
			Source *string `json:"source"`
			Prev   *string `json:"previous_response_id"`
		}
		if err := json.Unmarshal(body, &got); err != nil {
			// A value of another type for one of these keys: the provider
			// refuses the body.
			return
		}
		_ = v
		s := func(p *string) string {
			if p == nil {
				return ""
			}
			return *p
		}
		var want string
		switch route.keys[0] {
		case "model":
			want = s(got.Model)
			if len(route.keys) > 1 {
				want = cmp.Or(want, s(got.Name))
			}
		case "source":
			want = s(got.Source)
		}
		if want != model {
			t.Fatalf("routed on %q, the body names %q: %q (keys %v)", model, want, body, route.keys)
		}
		if route.also != "" && s(got.Prev) != follows {
			t.Fatalf("follows %q, the body names %q: %q", follows, s(got.Prev), body)
		}
	})
}

// FuzzScanMultipartModel reads arbitrary multipart bodies as the handler
// does (the form guard under the prefix, the scan, then the rest). It must
// never panic, must relay the body byte for byte when it accepts it, and
// the model it routes on must be the only non-file "model" field Go's
// multipart reader finds in a body that reaches the provider whole.
func FuzzScanMultipartModel(f *testing.F) {
	part := func(disposition, value string) string {
		return "--xyz\r\nContent-Disposition: " + disposition + "\r\n\r\n" + value + "\r\n"
	}
	for _, s := range []string{
		part(`form-data; name="model"`, "whisper-1") + part(`form-data; name="file"; filename="a.wav"`, "RIFF....") + "--xyz--\r\n",
		part(`form-data; name="file"; filename="model"`, "--xy\r\n--xyz-") + part(`form-data; name="model"`, " a ") + "--xyz--\r\n",
		part(`form-data; name="model"`, "a") + part(`form-data; name="model"`, "b") + "--xyz--\r\n",
		"--xyz\nContent-Disposition: form-data; name=model\n\na\n--xyz\ncontent-disposition: form-data; name=\"model\"\n\nb\n",
		part(`form-data; name="model"`, "a") + "--xyz  \r\nContent-Type: text/plain\r\nContent-Disposition: form-data;\r\n name=\"model\"\r\n\r\nb\r\n",
		part(`form-data; name="prompt"`, "Content-Disposition: form-data; name=\"model\"\r\n") + part(`form-data; name="model"`, "m") + "--xyz--\r\n",
		"--xyz\r\nContent-Disposition: form-data; name=\"model\"\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\na=3Db\r\n--xyz--\r\n",
	} {
		f.Add([]byte(s), uint8(0))
		f.Add([]byte(s), uint8(3))
	}
	const ct = `multipart/form-data; boundary="xyz"`
	f.Fuzz(func(t *testing.T, body []byte, split uint8) {
		var src io.Reader = bytes.NewReader(body)
		if split > 0 {
			src = &chunked{r: src, n: int(split)}
		}
		p := newPrefix(newFormGuard(src, ct), int64(len(body)))
		model, err := scanMultipartModel(p, ct, "model")
		if err != nil {
			return
		}
		if !relaysWhole(t, p, body) {
			return
		}
		if model == "" {
			return
		}
		// What a provider reads: every non-file field named model.
		mr := multipart.NewReader(bytes.NewReader(body), "xyz")
		var values []string
		for {
			pt, err := mr.NextRawPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return // the provider refuses the body
			}
			b, err := io.ReadAll(pt)
			if err != nil {
				return
			}
			if pt.FormName() == "model" && pt.FileName() == "" {
				values = append(values, strings.TrimSpace(string(b)))
			}
		}
		if len(values) != 1 || values[0] != model {
			t.Fatalf("routed on %q, the form's model fields are %q: %q", model, values, body)
		}
	})
}

// relaysWhole reads what the relay would send after the scan (p's head,
// then the rest through the guard) and reports whether the whole body goes
// through, failing t unless it is byte for byte the body. A guard refusing
// only after the whole body passed fails t too.
func relaysWhole(t *testing.T, p *prefix, body []byte) bool {
	t.Helper()
	head, rest := p.body()
	all := append([]byte(nil), head...)
	if rest != nil {
		b, err := io.ReadAll(rest)
		all = append(all, b...)
		if err != nil {
			if len(all) >= len(body) {
				t.Fatalf("guard failed (%v) only after the whole body passed", err)
			}
			return false
		}
	}
	if !bytes.Equal(all, body) {
		t.Fatalf("relayed %q, body %q", all, body)
	}
	return true
}
