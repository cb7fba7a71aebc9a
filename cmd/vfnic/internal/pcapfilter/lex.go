package pcapfilter

import (
	"errors"
	"fmt"
	"strings"
)

// ErrSyntax is what every *SyntaxError matches with errors.Is.
var ErrSyntax = errors.New("invalid filter expression")

// SyntaxError is an expression the compiler refuses: where, and what it
// wanted there.
type SyntaxError struct {
	Expr   string // the whole expression
	Offset int    // byte offset of the offending token; len(Expr) at the end
	Msg    string // what was expected, and what was found
}

// Error reports the column (1-based) and the problem.
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("column %d: %s", e.Offset+1, e.Msg)
}

// Is makes errors.Is(err, ErrSyntax) true.
func (e *SyntaxError) Is(target error) bool { return target == ErrSyntax }

// Caret returns the expression and, under it, a caret at the offending
// column, for a terminal.
func (e *SyntaxError) Caret() string {
	return e.Expr + "\n" + strings.Repeat(" ", e.Offset) + "^"
}

// token is a word or an operator of the expression.
type token struct {
	text string
	pos  int
}

// lex splits expr into words and the operators ( ) ! && ||. A word is a
// run of anything else but blanks, so that addresses (10.0.0.0/8,
// fe80::1, 00:11:22:33:44:55) and ranges (1000-2000) are single words.
func lex(expr string) ([]token, error) {
	var toks []token
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '(' || c == ')' || c == '!':
			toks = append(toks, token{expr[i : i+1], i})
			i++
		case c == '&' || c == '|':
			if i+1 < len(expr) && expr[i+1] == c {
				toks = append(toks, token{expr[i : i+2], i})
				i += 2
				continue
			}
			return nil, &SyntaxError{expr, i, fmt.Sprintf("%q alone is not an operator: want %q or %q", c, "&&", "||")}
		case c == '[' || c == ']':
			return nil, &SyntaxError{expr, i, "packet-data accessors (tcp[13], ip[2:2]) are not supported: use the primitives (host, net, port, proto, vlan, ether, less, greater)"}
		case c < 0x20 || c >= 0x7f:
			return nil, &SyntaxError{expr, i, fmt.Sprintf("unexpected character %q", c)}
		default:
			j := i
			for j < len(expr) && !strings.ContainsRune(" \t\n\r()!&|[]", rune(expr[j])) && expr[j] >= 0x20 && expr[j] < 0x7f {
				j++
			}
			toks = append(toks, token{expr[i:j], i})
			i = j
		}
	}
	return toks, nil
}
