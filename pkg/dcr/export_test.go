package dcr

// Test hooks: the two paths of ParseSIP, to compare them.
var (
	ScanSIP      = scanSIP
	ParseSIPFull = parseSIPFull
	CheckRequest = checkRequest
)
