// Package redact hides the secrets of Postgres and Redis URLs for logs, messages,
// API answers and the audit log: the one place that knows how.
package redact

import (
	"net/url"
	"strings"
)

// Mask replaces every hidden secret.
const Mask = "xxxxx"

// URL returns s with its password, and the value of every query parameter that may
// hold one (password, passwd, pass, secret, token), replaced by Mask. A string that
// does not parse as a URL comes back as "(unparsable url)" when it may hold a
// password (it has '@' or a query), else unchanged.
func URL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		if strings.ContainsAny(s, "@?") {
			return "(unparsable url)"
		}
		return s
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), Mask)
	}
	if u.RawQuery != "" {
		q, changed := u.Query(), false
		for k := range q {
			if secretParam(k) {
				q[k], changed = []string{Mask}, true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
	}
	return u.String()
}

// Error returns err's message with the secrets of the URL s replaced by Mask (parse
// errors quote the URL they could not parse). When s does not parse and may hold a
// password, the message is not shown at all.
func Error(err error, s string) string {
	msg := err.Error()
	u, perr := url.Parse(s)
	if perr != nil {
		if strings.ContainsAny(s, "@?") {
			return "not a valid url (not shown: it may hold a password)"
		}
		return msg
	}
	if pw, ok := u.User.Password(); ok && pw != "" {
		msg = strings.ReplaceAll(msg, pw, Mask)
	}
	for k, vs := range u.Query() {
		if secretParam(k) {
			for _, v := range vs {
				if v != "" {
					msg = strings.ReplaceAll(msg, v, Mask)
				}
			}
		}
	}
	return msg
}

// Item returns item (a "name=url" list entry) for a message, or "<redacted>" when it
// may hold a password.
func Item(item string) string {
	if strings.ContainsAny(item, "@?") {
		return "<redacted>"
	}
	return item
}

func secretParam(name string) bool {
	switch strings.ToLower(name) {
	case "password", "passwd", "pass", "secret", "token":
		return true
	}
	return false
}

// WebhookURL is URL for a webhook URL: any user info is a credential there (a token as
// the user name as well as a password), so it is masked whole, as are secret query
// parameters.
func WebhookURL(s string) string {
	u, err := url.Parse(s)
	if err == nil && u.User != nil {
		if _, has := u.User.Password(); !has {
			u.User = url.User(Mask)
			s = u.String()
		}
	}
	return URL(s)
}
