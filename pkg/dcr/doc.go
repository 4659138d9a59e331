// Package dcr implements data-centric rules (DCR): the data-centric-rules.xml file of the
// converged HTTP/SIP load balancer (SailFin / OCCAS CLB lineage) whose rules extract one
// consistent-hash key from HTTP and SIP requests, so that both halves of a converged session
// reach the same instance.
//
// # Messages
//
// Rules run over a protocol-neutral Message: ParseSIP (github.com/emiago/sipgo's grammar; a
// fast path scans the common request without building a header object per line, values
// produced on demand, and hands anything unusual to sipgo's whole parser) or ParseSIPRequest
// (the same, held to RFC 3261 §8.1.1) for a raw SIP request, NewHTTPMessage for an HTTP
// request. When no rule yields a key, callers use
// DefaultSIPKey (From tag + ":" + Call-ID) or DefaultHTTPKey (the remote "host:port"). Rules
// are meant for initial requests only; in-dialog SIP requests follow their route set.
//
// # File format
//
//	<user-centric-rules>                  root; at most one of each child, any order
//	  <sip-rules>  rule*  </sip-rules>    rules for SIP requests
//	  <http-rules> rule*  </http-rules>   rules for HTTP requests
//	</user-centric-rules>
//
//	rule := <or> rule+ </or>
//	      | <and> rule+ </and>
//	      | <if> rule+ </if>
//	      | <session-case> <equal>ORIGINATING|TERMINATING</equal> rule* </session-case>
//	      | <header name="H" [return="VAR"]> cond </header>
//	      | <cookie name="C" [return="VAR"]> cond </cookie>
//	      | <request-uri [parameter="P"] [return="VAR"]> cond </request-uri>
//	cond := <exist/> | <notexist/> | <match>REGEXP</match>
//
// A DOCTYPE is allowed and ignored. Encodings UTF-8, US-ASCII and ISO-8859-1 are accepted.
// Unknown elements or attributes, stray text, a missing name/parameter attribute, an empty
// or/and/if, a bad <equal>, an invalid pattern or an unknown return variable reject the file
// with an *Error "file:line: reason". Files over MaxFileSize bytes or nested deeper than
// MaxDepth are rejected too. The parameter attribute of <request-uri> is required with
// <exist/> and <notexist/> and optional with <match> (without it the whole request URI is
// matched).
//
// # Evaluation
//
// Every rule yields a value or null. The rules of the message's protocol run in document
// order and the first non-null value is the key. <or> yields its first non-null operand; <and>
// yields its last operand when none is null; <if> yields its first non-null child (in the
// documented example an <if> holds "P-Asserted-Identity if present" followed by the From
// fallback, so <if> reads as an ordered list of alternatives; a guard is written with <and> or
// <session-case>). <session-case> yields its first non-null nested rule when the request's
// session case equals <equal>, and null otherwise.
//
// A test (<header>, <cookie>, <request-uri>) holds when its condition holds: <exist/> — the
// header, cookie or request-URI parameter is present; <notexist/> — it is absent; <match> —
// it is present and the pattern matches its value (for <request-uri> without parameter, the
// whole request URI). A test that holds yields the value of its return variable, and is null
// when that value is empty or absent (e.g. request.From.uri.user of a From without user part,
// or parameter.user.uri.user of a parameter that is not a URI). A test without return (a
// tether extension, handy for guards) yields the tested value (exist), the matched text
// (match), or a bare "matched" marker (notexist, or an empty value). A marker is non-null
// inside or/and/if/session-case but is never a key: a top-level rule ending in one counts as
// no match and evaluation goes on with the next rule. Key therefore never returns an empty
// key.
//
// # Choices where the reference is silent
//
//   - <match> holds a Go RE2 regular expression (package regexp), unanchored, trimmed of
//     surrounding white space; add ^ and $ to anchor. The matched text (variable "match") is
//     the first capture group that took part in the match, or the whole match when the
//     pattern has no group. RE2 runs in linear time, so a pattern cannot stall a request.
//   - <header> accepts <match> as well as <exist/> and <notexist/> (the reference's
//     request.<header>.match variable implies it); <cookie> accepts it too.
//   - Header names compare case-insensitively (as both protocols define them) and SIP compact
//     forms are understood (f = From, t = To, i = Call-ID, …); cookie and parameter names and
//     the <equal> value are case-sensitive. A header that occurs more than once is seen
//     through its first occurrence; a header whose value lists several addresses
//     (P-Asserted-Identity: <sip:…>, <tel:…>) yields its first address for URI variables.
//   - Session case: P-Served-User's sescase parameter (RFC 5502) decides when present;
//     otherwise an "orig" parameter on the topmost Route URI means ORIGINATING (3GPP TS 24.229
//     ISC marking); any other SIP request is TERMINATING. HTTP requests have no session case,
//     so <session-case> never holds for them.
//   - resolve (ENUM in the reference) does not query DNS: a DNS round trip per initial request
//     would break the sub-millisecond decision budget and make keys depend on resolver state.
//     Instead resolve canonicalizes telephone numbers: for a tel URI, a SIP URI with
//     user=phone or a global number ("+…"), visual separators (- . ( ) space) and ';'
//     parameters are removed from the user part, so tel:+1-212-555-0100,
//     sip:+1.212.555.0100@ims.example;user=phone and "+12125550100" all resolve to user
//     +12125550100. Other URIs resolve to themselves. resolve.host of a tel URI is null.
//   - A bare global number in a header, parameter or cookie value counts as a tel URI for
//     .uri variables.
//
// # Return variables
//
//	match                          text matched by this rule's <match>
//	match.resolve.user             that text as a URI or number, resolved, user part
//	request.method                 request method
//	request.uri                    request URI as received
//	request.uri.scheme|user|host|port
//	request.uri.resolve[.user|.host]
//	request.<header>               header value
//	request.<header>.uri[.scheme|.user|.host|.port|.display-name]
//	request.<header>.uri.resolve[.user|.host]
//	request.<header>.tag           the header's tag parameter (tether extension)
//	request.<header>.match[.resolve.user]   like match; only in <header name="<header>"> with <match>
//	parameter.<name>[.uri[.scheme|.user|.host|.port]]   request-URI / query parameter
//	parameter.<name>.uri.resolve[.user|.host]
//	cookie.<name>[.uri…]           cookie value (tether extension)
//
// "request.uri…" and "request.method" always mean the request line, so headers named "uri" or
// "method" cannot be addressed. Every variable is available to both protocols; a part a
// message does not have (e.g. request.uri.user of an HTTP request) is null.
//
// # Reloading
//
// Watcher polls the file and swaps in new Rules atomically; a request uses the Rules it took
// when it started, so a reload affects only new initial requests. A broken file on reload
// keeps the previous rules and is logged.
package dcr
