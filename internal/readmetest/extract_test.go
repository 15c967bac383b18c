package readmetest

import (
	"fmt"
	"regexp"
	"strings"
)

// example is one command of a page (README.md, docs/TOUR.md) that talks to the API.
type example struct {
	line     int    // the page's line of the command's first line
	command  string // as printed
	expected string // what the README shows for it ("" when nothing)
}

// placeholder is a `NAME=...` line: a page's way to say "put your token here".
type placeholder struct {
	line int
	name string
}

var placeholderLine = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)=\.\.\.(\s+#.*)?$`)

// apiAddr matches the address the pages' commands talk to.
var apiAddr = regexp.MustCompile(`\b(localhost|127\.0\.0\.1):8080\b`)

// extract lists a page's commands that talk to the API, with what it shows for each,
// and its placeholders, in page order.
func extract(readme string) ([]example, []placeholder, error) {
	lines := strings.Split(strings.ReplaceAll(readme, "\r\n", "\n"), "\n")
	var examples []example
	var holders []placeholder
	for i := 0; i < len(lines); i++ {
		info, ok := fence(lines[i])
		if !ok {
			continue
		}
		start := i + 1
		end := closing(lines, start)
		if end < 0 {
			return nil, nil, fmt.Errorf("line %d: fenced block never closed", i+1)
		}
		i = end
		if info != "sh" && info != "bash" && info != "shell" {
			continue
		}
		block, hs, err := commands(lines[start:end], start)
		if err != nil {
			return nil, nil, err
		}
		holders = append(holders, hs...)
		// A fenced block right after this one (blank lines only between) shows what
		// the block's last command answers.
		j := end + 1
		for j < len(lines) && strings.TrimSpace(lines[j]) == "" {
			j++
		}
		if j < len(lines) {
			if info, ok := fence(lines[j]); ok && info != "sh" && info != "bash" && info != "shell" {
				oend := closing(lines, j+1)
				if oend < 0 {
					return nil, nil, fmt.Errorf("line %d: fenced block never closed", j+1)
				}
				if len(block) > 0 {
					last := &block[len(block)-1]
					if last.expected != "" {
						return nil, nil, fmt.Errorf("line %d: the command shows its answer twice (comments and the block at line %d)", last.line, j+1)
					}
					last.expected = strings.Join(lines[j+1:oend], "\n")
				}
				i = oend
			}
		}
		for _, ex := range block {
			if apiAddr.MatchString(ex.command) {
				examples = append(examples, ex)
			}
		}
	}
	return examples, holders, nil
}

// fence reports whether line opens or closes a fenced block, and its info string.
func fence(line string) (string, bool) {
	rest, ok := strings.CutPrefix(line, "```")
	if !ok {
		return "", false
	}
	return strings.TrimSpace(rest), true
}

func closing(lines []string, from int) int {
	for k := from; k < len(lines); k++ {
		if strings.TrimSpace(lines[k]) == "```" {
			return k
		}
	}
	return -1
}

// commands splits the lines of a shell block into commands, each with the comment
// lines right under it as its expected answer. first is the page's index of lines[0].
func commands(lines []string, first int) ([]example, []placeholder, error) {
	var out []example
	var holders []placeholder
	var cur *example // the command whose answer may follow
	for k := 0; k < len(lines); k++ {
		line := lines[k]
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "":
			cur = nil
		case strings.HasPrefix(trimmed, "#"):
			if cur != nil {
				text := strings.TrimPrefix(strings.TrimPrefix(trimmed, "#"), " ")
				if cur.expected != "" {
					cur.expected += "\n"
				}
				cur.expected += text
			}
		default:
			if m := placeholderLine.FindStringSubmatch(trimmed); m != nil {
				holders = append(holders, placeholder{line: first + k + 1, name: m[1]})
				cur = nil
				continue
			}
			start := k
			cmd := line
			for open(cmd) {
				if k+1 >= len(lines) {
					return nil, nil, fmt.Errorf("line %d: command never ends (open quote or trailing \\)", first+start+1)
				}
				k++
				cmd += "\n" + lines[k]
			}
			out = append(out, example{line: first + start + 1, command: cmd})
			cur = &out[len(out)-1]
		}
	}
	return out, holders, nil
}

// open reports whether a shell command continues on the next line: a quote is still
// open, or the text ends with a backslash outside quotes.
func open(cmd string) bool {
	var quote byte
	for i := 0; i < len(cmd); i++ {
		c := cmd[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			}
		case quote == '"':
			if c == '\\' {
				i++
			} else if c == '"' {
				quote = 0
			}
		case c == '\\':
			if i == len(cmd)-1 {
				return true
			}
			i++
		case c == '\'' || c == '"':
			quote = c
		case c == '#' && (i == 0 || cmd[i-1] == ' ' || cmd[i-1] == '\t'):
			// A comment runs to the end of its line.
			for i < len(cmd) && cmd[i] != '\n' {
				i++
			}
		}
	}
	return quote != 0
}
