// Package models reads the model lists providers answer with, for the
// edge's model catalog (its ports.ModelLister): each provider type's path
// and JSON shape stay here, out of the use case.
package models

import (
	"encoding/json"
	"net/url"
	"time"

	"iop/domain"
)

// Lists is the ports.ModelLister of the provider types iop knows: OpenAI
// (and OpenAI-compatible servers), Ollama and Anthropic.
type Lists struct{}

// ModelListPath is Ollama's GET /api/tags for type ollama, GET /v1/models
// (OpenAI's and Anthropic's Models API) otherwise.
func (Lists) ModelListPath(typ string) string {
	if typ == domain.ProviderOllama {
		return "/api/tags"
	}
	return "/v1/models"
}

// anthropicPage is the most models Anthropic's Models API lists per page
// (its default is 20, newest first).
const anthropicPage = "1000"

// ModelListQuery pages Anthropic's Models API: the first page asks for
// limit=1000, and while an answer says has_more the next asks for the
// models after its last_id. OpenAI's and Ollama's lists are one page.
func (Lists) ModelListQuery(typ string, prev []byte) (string, bool) {
	if typ != domain.ProviderAnthropic {
		return "", prev == nil
	}
	if prev == nil {
		return "limit=" + anthropicPage, true
	}
	var page struct {
		HasMore bool   `json:"has_more"`
		LastID  string `json:"last_id"`
	}
	if json.Unmarshal(prev, &page) != nil || !page.HasMore || page.LastID == "" {
		return "", false
	}
	return url.Values{"limit": {anthropicPage}, "after_id": {page.LastID}}.Encode(), true
}

// ParseModelList reads a provider's model list: OpenAI's
// {"object":"list","data":[{"id","created",…}]} for type openai (and
// Anthropic's {"data":[{"id","created_at",…}]} for type anthropic), Ollama's
// {"models":[{"name","model","modified_at",…}]} for type ollama. Raw is kept for Ollama
// entries only; entries without an id are skipped.
func (Lists) ParseModelList(typ string, body []byte) ([]domain.ListedModel, error) {
	var out []domain.ListedModel
	switch typ {
	case domain.ProviderOllama:
		var doc struct {
			Models []json.RawMessage `json:"models"`
		}
		if err := json.Unmarshal(body, &doc); err != nil {
			return nil, domain.Errorf(domain.CodeProviderError, "parse /api/tags: %v", err)
		}
		for _, raw := range doc.Models {
			var m struct {
				Name       string `json:"name"`
				Model      string `json:"model"`
				ModifiedAt string `json:"modified_at"`
			}
			if json.Unmarshal(raw, &m) != nil {
				continue
			}
			id := m.Name
			if id == "" {
				id = m.Model
			}
			if id != "" {
				e := domain.ListedModel{ID: id, Raw: append([]byte(nil), raw...)}
				if t, err := time.Parse(time.RFC3339Nano, m.ModifiedAt); err == nil {
					e.Created = t.Unix()
				}
				out = append(out, e)
			}
		}
	default:
		var doc struct {
			Data []struct {
				ID        string `json:"id"`
				Created   int64  `json:"created"`
				CreatedAt string `json:"created_at"` // Anthropic's Models API
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &doc); err != nil {
			return nil, domain.Errorf(domain.CodeProviderError, "parse /v1/models: %v", err)
		}
		for _, m := range doc.Data {
			if m.ID != "" {
				e := domain.ListedModel{ID: m.ID, Created: m.Created}
				if t, err := time.Parse(time.RFC3339Nano, m.CreatedAt); err == nil && e.Created == 0 {
					e.Created = t.Unix()
				}
				out = append(out, e)
			}
		}
	}
	return out, nil
}
