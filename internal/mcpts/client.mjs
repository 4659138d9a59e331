// Drives the official TypeScript MCP SDK client for tether's affinity tests.
//
// usage: node client.mjs '<json>'   with json = {
//   "url": "http://127.0.0.1:10000/mcp",     endpoint (Streamable HTTP) or SSE URL
//   "transport": "streamable" | "sse",
//   "calls": 5,                               how many "whoami" tool calls
//   "roots": true,                            also call "roots" (server→client request)
//   "terminate": true,                        DELETE the session at the end (streamable)
//   "hold": true,                             after the calls print {"event":"holding"} and
//                                             wait for a line (or EOF) on stdin before ending
//   "sdk": "v1" | "v2"                        the 1.x @modelcontextprotocol/sdk package (default)
//                                             or the 2.x @modelcontextprotocol/client package
// }
// Prints one JSON object per line: {"event":"connected","sessionId":...,"protocolVersion":...},
// {"event":"call","tool":...,"result":{instance,session,roots}}, {"event":"done"}, {"event":"warning","message":..} (a transport error) or
// {"event":"error","status":..,"message":..}. Exit code 0 on success, 1 on error.
const cfg = JSON.parse(process.argv[2] ?? '{}');

// sdk loads one SDK generation: v1 (one package, handlers keyed by zod schema) or v2 (split
// client package, handlers keyed by method name).
async function sdk(version) {
  if (version === 'v2') {
    const m = await import('@modelcontextprotocol/client');
    return { Client: m.Client, StreamableHTTPClientTransport: m.StreamableHTTPClientTransport,
      SSEClientTransport: m.SSEClientTransport, rootsList: 'roots/list' };
  }
  const [c, st, sse, types] = await Promise.all([
    import('@modelcontextprotocol/sdk/client/index.js'),
    import('@modelcontextprotocol/sdk/client/streamableHttp.js'),
    import('@modelcontextprotocol/sdk/client/sse.js'),
    import('@modelcontextprotocol/sdk/types.js'),
  ]);
  return { Client: c.Client, StreamableHTTPClientTransport: st.StreamableHTTPClientTransport,
    SSEClientTransport: sse.SSEClientTransport, rootsList: types.ListRootsRequestSchema };
}
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
// result prefers structured content and falls back to JSON in the first text block.
const result = (res) => {
  if (res.structuredContent) return res.structuredContent;
  const text = res.content?.find((c) => c.type === 'text')?.text;
  try { return text ? JSON.parse(text) : null; } catch { return null; }
};

async function main() {
  const { Client, StreamableHTTPClientTransport, SSEClientTransport, rootsList } = await sdk(cfg.sdk);
  const url = new URL(cfg.url);
  const transport = cfg.transport === 'sse'
    ? new SSEClientTransport(url)
    : new StreamableHTTPClientTransport(url);
  const client = new Client({ name: 'tether-ts-test', version: '1' }, { capabilities: { roots: { listChanged: false } } });
  client.setRequestHandler(rootsList, async () => ({
    roots: [{ uri: 'file:///tmp/a', name: 'a' }, { uri: 'file:///tmp/b', name: 'b' }],
  }));
  // Transport and protocol errors (a failed reply POST, a dropped stream) would pass silently.
  client.onerror = (err) => out({ event: 'warning', message: String(err?.message ?? err) });
  await client.connect(transport);
  // protocolVersion: what the transport negotiated and now sends as mcp-protocol-version.
  out({
    event: 'connected',
    sessionId: transport.sessionId ?? null,
    protocolVersion: transport.protocolVersion ?? transport._protocolVersion ?? null,
  });
  for (let i = 0; i < (cfg.calls ?? 1); i++) {
    const res = await client.callTool({ name: 'whoami', arguments: {} });
    out({ event: 'call', tool: 'whoami', result: result(res) });
  }
  if (cfg.roots) {
    const res = await client.callTool({ name: 'roots', arguments: {} });
    out({ event: 'call', tool: 'roots', result: result(res) });
  }
  if (cfg.hold) {
    out({ event: 'holding' });
    await new Promise((resolve) => {
      process.stdin.once('data', resolve);
      process.stdin.once('end', resolve);
    });
    process.stdin.destroy();
  }
  if (cfg.terminate && cfg.transport !== 'sse') {
    await transport.terminateSession();
  }
  await client.close();
  out({ event: 'done' });
}

main().catch((err) => {
  out({ event: 'error', status: err?.code ?? null, message: String(err?.message ?? err) });
  process.exit(1);
});
