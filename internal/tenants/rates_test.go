package tenants_test

import (
	"testing"

	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Prices parse exactly into micro-units, and nothing else parses: no float, no
// sign, no exponent, no part of a micro-unit, nothing above 2^50 micro-units.
func TestParsePrice(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"2.50", 2_500_000, true},
		{"0.000001", 1, true},
		{"10", 10_000_000, true},
		{"0.1", 100_000, true}, // 0.1 is exact here, as it is not in binary floating point
		{"1125899906.842624", 1 << 50, true},
		{"1125899906.842625", 0, false}, // one micro-unit above the bound
		{"0.0000001", 0, false},
		{"1e-3", 0, false},
		{"-1", 0, false},
		{"1.", 0, false},
		{"", 0, false},
	} {
		got, err := tenants.ParsePrice(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParsePrice(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// Money reads as people write it, in the currency's own places.
func TestFormatMoney(t *testing.T) {
	for _, tc := range []struct {
		micros int64
		cur    string
		want   string
	}{
		{2_500_000_000, "USD", "2,500.00 USD"},
		{1_234_560_000, "USD", "1,234.56 USD"},
		{1_500, "USD", "0.0015 USD"},
		{0, "USD", "0.00 USD"},
		{1_000_000_000_000, "JPY", "1,000,000 JPY"},
		{123_000_000, "", "123.00"},
	} {
		if got := tenants.FormatMoney(tc.micros, tc.cur); got != tc.want {
			t.Errorf("FormatMoney(%d, %q) = %q, want %q", tc.micros, tc.cur, got, tc.want)
		}
	}
	if got := tenants.FormatMicros(12_860_145); got != "12.860145" {
		t.Errorf("FormatMicros = %q", got)
	}
	for code, want := range map[string]bool{"USD": true, "EUR": true, "ABC": false, "usd": false, "US": false} {
		if got := tenants.ValidCurrency(code); got != want {
			t.Errorf("ValidCurrency(%q) = %v", code, got)
		}
	}
}
