package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// API keys of an org.

// CreateApiKey handles POST /v1/orgs/{org}/api-keys; the secret is in this answer only.
func (s *Server) CreateApiKey(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	var in api.ApiKeyCreate
	if !decode(w, r, &in) {
		return
	}
	k, secret, err := s.tenants.CreateAPIKey(r.Context(), actor(r), org, toKeyInput(in))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v := fromKey(k)
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, api.ApiKeyCreated{Id: v.Id, Name: v.Name, Prefix: v.Prefix, Scopes: v.Scopes,
		CreatedAt: v.CreatedAt, LastUsedAt: v.LastUsedAt, RevokedAt: v.RevokedAt, Secret: secret})
}

// ListApiKeys handles GET /v1/orgs/{org}/api-keys.
func (s *Server) ListApiKeys(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ListApiKeysParams) {
	ks, next, err := s.tenants.ListAPIKeys(r.Context(), org, page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ApiKeyList{Items: mapSlice(ks, fromKey), NextCursor: nextPtr(next)})
}

// RevokeApiKey handles DELETE /v1/orgs/{org}/api-keys/{key}.
func (s *Server) RevokeApiKey(w http.ResponseWriter, r *http.Request, org api.OrgPath, key api.KeyPath) {
	s.noContent(w, r, s.tenants.RevokeAPIKey(r.Context(), actor(r), org, key))
}

func toKeyInput(in api.ApiKeyCreate) tenants.APIKeyInput {
	k := tenants.APIKeyInput{Name: in.Name}
	for _, s := range in.Scopes {
		k.Scopes = append(k.Scopes, tenants.Scope(s))
	}
	return k
}

func fromKey(k tenants.APIKey) api.ApiKey {
	scopes := make([]api.Scope, len(k.Scopes))
	for i, s := range k.Scopes {
		scopes[i] = api.Scope(s)
	}
	return api.ApiKey{Id: k.ID, Name: k.Name, Prefix: k.Prefix, Scopes: scopes, CreatedAt: k.CreatedAt,
		LastUsedAt: k.LastUsedAt, RevokedAt: k.RevokedAt}
}
