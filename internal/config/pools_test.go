package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/config"
)

func TestParsePools(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    map[string]string
		wantErr []string // substrings of the error
	}{
		{name: "empty", in: "", want: map[string]string{}},
		{name: "blank", in: "  ", want: map[string]string{}},
		{name: "two pools", in: "free=redis://r1:6379/0, pro = redis://:pw@r2:6380/1",
			want: map[string]string{"free": "redis://r1:6379/0", "pro": "redis://:pw@r2:6380/1"}},
		{name: "tls", in: "ent=rediss://r3:6379", want: map[string]string{"ent": "rediss://r3:6379"}},
		{name: "missing equals", in: "free", wantErr: []string{`item 1 ("free") is not class=redis-url`}},
		{name: "empty item", in: "free=redis://r1,,pro=redis://r2", wantErr: []string{"item 2 is empty"}},
		{name: "bad class", in: "fr ee=redis://r1", wantErr: []string{`pool class "fr ee" is not a valid id`}},
		{name: "duplicate class", in: "free=redis://r1,free=redis://r2", wantErr: []string{`pool class "free" is given twice`}},
		{name: "no url", in: "free=", wantErr: []string{`pool "free" has no redis url`}},
		{name: "bad scheme", in: "free=http://r1", wantErr: []string{`pool "free": redis url http://r1`}},
		{name: "password not shown", in: "pro=http://:s3cret@r2", wantErr: []string{`pool "pro": redis url http://:xxxxx@r2`}},
		{name: "every problem", in: "a,b=,c=redis://r", wantErr: []string{"item 1", `pool "b" has no redis url`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := config.ParsePools(tt.in)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("(-want +got):\n%s", diff)
				}
				return
			}
			if !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("error %v, want ErrInvalid", err)
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q lacks %q", err, s)
				}
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
}
