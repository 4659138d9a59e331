package quota

// LeaseScriptE11d6a0Verbatim is e11d6a0's lease script, for tests that play a replica of it.
const LeaseScriptE11d6a0Verbatim = leaseScriptE11d6a0Verbatim
