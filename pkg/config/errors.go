package config

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// FieldError is one problem in a config file: where it is and what is wrong.
type FieldError struct {
	// File is the file name as given to Load or Parse.
	File string
	// Line is the 1-based line of the offending field, or 0 when the problem has no place in
	// the file (a missing top-level field, an unreadable file).
	Line int
	// Field is the field path, e.g. "services[0].sessionsPerInstance"; "" for file-level
	// problems such as YAML syntax errors.
	Field string
	// Message says what is wrong, e.g. "500 is out of range 1..200".
	Message string
}

// Error formats the problem as "file:line: field: message", leaving out the parts that are
// unknown.
func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	return b.String()
}

// Errors is every problem found in one config file, ordered by line. Load and Parse return it
// (as a value) when the file is invalid; use errors.As(err, &errs) with errs of type Errors.
type Errors []*FieldError

// Error lists the problems one per line.
func (e Errors) Error() string {
	lines := make([]string, len(e))
	for i, fe := range e {
		lines[i] = fe.Error()
	}
	return strings.Join(lines, "\n")
}

// errList collects FieldErrors while a file is decoded and validated. It keeps at most one
// error per field path so that a value that failed to decode is not reported again by a later
// check that sees the default left in its place.
type errList struct {
	file string
	errs Errors
	seen map[string]bool
}

func newErrList(file string) *errList {
	return &errList{file: file, seen: map[string]bool{}}
}

func (l *errList) add(line int, field, format string, args ...any) {
	if field != "" {
		if l.seen[field] {
			return
		}
		l.seen[field] = true
	}
	l.errs = append(l.errs, &FieldError{File: l.file, Line: line, Field: field, Message: fmt.Sprintf(format, args...)})
}

// always records an error even if the field already has one (e.g. a duplicate key), and
// leaves later checks of the field free to report their own problem.
func (l *errList) always(line int, field, format string, args ...any) {
	l.errs = append(l.errs, &FieldError{File: l.file, Line: line, Field: field, Message: fmt.Sprintf(format, args...)})
}

// has reports whether an error was recorded for the field.
func (l *errList) has(field string) bool { return l.seen[field] }

// result returns the errors sorted by line (stable, so errors on one line keep the order in
// which they were found), or nil when there are none.
func (l *errList) result() error {
	if len(l.errs) == 0 {
		return nil
	}
	out := slices.Clone(l.errs)
	slices.SortStableFunc(out, func(a, b *FieldError) int { return cmp.Compare(a.Line, b.Line) })
	return out
}
