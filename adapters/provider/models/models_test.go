package models_test

import (
	"testing"

	"iop/adapters/provider/models"
	"iop/domain"
)

func TestParseModelList(t *testing.T) {
	var lists models.Lists
	if _, err := lists.ParseModelList(domain.ProviderOpenAI, []byte("not json")); domain.CodeOf(err) != domain.CodeProviderError {
		t.Fatalf("bad openai list: %v", err)
	}
	if _, err := lists.ParseModelList(domain.ProviderOllama, []byte(`{"models":7}`)); domain.CodeOf(err) != domain.CodeProviderError {
		t.Fatalf("bad ollama list: %v", err)
	}
	es, err := lists.ParseModelList(domain.ProviderOllama, []byte(`{"models":[{"name":"a"},"junk",{"model":"b"},{}]}`))
	if err != nil || len(es) != 2 || es[0].ID != "a" || es[1].ID != "b" {
		t.Fatalf("ollama list = %+v, %v", es, err)
	}
	es, err = lists.ParseModelList(domain.ProviderAnthropic, []byte(`{"data":[{"type":"model","id":"claude-sonnet-4-5","display_name":"Claude Sonnet 4.5","created_at":"2025-09-29T00:00:00Z"}],"has_more":false,"first_id":"claude-sonnet-4-5","last_id":"claude-sonnet-4-5"}`))
	if err != nil || len(es) != 1 || es[0].ID != "claude-sonnet-4-5" || es[0].Created != 1759104000 {
		t.Fatalf("anthropic list = %+v, %v", es, err)
	}
	es, err = lists.ParseModelList(domain.ProviderOpenAI, []byte(`{"data":[]}`))
	if err != nil || len(es) != 0 {
		t.Fatalf("empty list = %+v, %v", es, err)
	}
}

func TestModelListPath(t *testing.T) {
	for typ, want := range map[string]string{domain.ProviderOllama: "/api/tags", domain.ProviderOpenAI: "/v1/models", domain.ProviderAnthropic: "/v1/models"} {
		if got := (models.Lists{}).ModelListPath(typ); got != want {
			t.Errorf("ModelListPath(%s) = %s, want %s", typ, got, want)
		}
	}
}

func TestModelListQuery(t *testing.T) {
	var lists models.Lists
	for _, c := range []struct {
		typ  string
		prev string // "-": the first page
		want string
		ok   bool
	}{
		{domain.ProviderOpenAI, "-", "", true},
		{domain.ProviderOpenAI, `{"data":[],"has_more":true,"last_id":"x"}`, "", false},
		{domain.ProviderOllama, "-", "", true},
		{domain.ProviderAnthropic, "-", "limit=1000", true},
		{domain.ProviderAnthropic, `{"data":[{"id":"claude-a"}],"has_more":true,"first_id":"claude-a","last_id":"claude-a&b"}`, "after_id=claude-a%26b&limit=1000", true},
		{domain.ProviderAnthropic, `{"data":[{"id":"claude-a"}],"has_more":false,"last_id":"claude-a"}`, "", false},
		{domain.ProviderAnthropic, `{"data":[],"has_more":true,"last_id":null}`, "", false},
	} {
		var prev []byte
		if c.prev != "-" {
			prev = []byte(c.prev)
		}
		if q, ok := lists.ModelListQuery(c.typ, prev); q != c.want || ok != c.ok {
			t.Errorf("ModelListQuery(%s, %s) = %q, %v; want %q, %v", c.typ, c.prev, q, ok, c.want, c.ok)
		}
	}
}
