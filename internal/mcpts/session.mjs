// An interactive official TypeScript MCP SDK client for tether's tests: the Go side (session.go)
// sends one JSON command a line on stdin and reads one JSON answer a line on stdout.
//
// usage: node session.mjs '<json>'   with json = {
//   "url": "http://127.0.0.1:10000/mcp",   Streamable HTTP endpoint
//   "sdk": "v1" | "v2",                     the 1.x @modelcontextprotocol/sdk package (default) or
//                                           the 2.x @modelcontextprotocol/client package
//   "pin": "2026-07-28"                     v2 only: ClientOptions.versionNegotiation
//                                           { mode: { pin } } — probe with server/discover and
//                                           run the sessionless era at exactly this revision,
//                                           failing if the server does not offer it (without
//                                           it the client runs the 2025-era initialize
//                                           handshake: versionNegotiation's default mode is
//                                           'legacy')
// }
// First line out: {"event":"connected","era":..,"protocolVersion":..,"sessionId":..} or
// {"event":"error",...}. Then for each command line
//   {"id":1,"op":"listTools"}                          -> {"id":1,"ok":true,"result":{tools}}
//   {"id":2,"op":"callTool","name":..,"arguments":{}}  -> {"id":2,"ok":true,"result":{CallToolResult}}
//   {"id":3,"op":"close"}                              -> {"id":3,"ok":true}, then exit 0
// a failed command answers {"id":..,"ok":false,"status":<HTTP status or null>,"code":..,"message":..}.
// EOF on stdin closes the client and exits.
import { createInterface } from 'node:readline';

const cfg = JSON.parse(process.argv[2] ?? '{}');
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');

async function sdk(version) {
  if (version === 'v2') {
    const m = await import('@modelcontextprotocol/client');
    return { Client: m.Client, StreamableHTTPClientTransport: m.StreamableHTTPClientTransport };
  }
  const [c, st] = await Promise.all([
    import('@modelcontextprotocol/sdk/client/index.js'),
    import('@modelcontextprotocol/sdk/client/streamableHttp.js'),
  ]);
  return { Client: c.Client, StreamableHTTPClientTransport: st.StreamableHTTPClientTransport };
}

// failure describes an error: the HTTP status of a non-2xx answer (v2 SdkHttpError keeps it in
// data.status, v1 StreamableHTTPError in code), else the JSON-RPC error code.
function failure(err) {
  const status = err?.data?.status ?? (err?.constructor?.name === 'StreamableHTTPError' ? err.code : null);
  return { ok: false, status: status ?? null, code: err?.code ?? null, message: String(err?.message ?? err) };
}

async function main() {
  const { Client, StreamableHTTPClientTransport } = await sdk(cfg.sdk);
  const options = {};
  if (cfg.pin) {
    if (cfg.sdk !== 'v2') throw new Error('pin needs the 2.x client (sdk "v2")');
    options.versionNegotiation = { mode: { pin: cfg.pin } };
  }
  const client = new Client({ name: 'tether-ts-session', version: '1' }, options);
  client.onerror = (err) => process.stderr.write(`client error: ${err?.message ?? err}\n`);
  const transport = new StreamableHTTPClientTransport(new URL(cfg.url));
  await client.connect(transport);
  out({
    event: 'connected',
    era: client.getProtocolEra?.() ?? 'legacy',
    protocolVersion: client.getNegotiatedProtocolVersion?.() ?? transport.protocolVersion ?? null,
    sessionId: transport.sessionId ?? null,
  });
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (!line.trim()) continue;
    const cmd = JSON.parse(line);
    try {
      switch (cmd.op) {
        case 'listTools':
          out({ id: cmd.id, ok: true, result: await client.listTools() });
          break;
        case 'callTool':
          out({ id: cmd.id, ok: true, result: await client.callTool({ name: cmd.name, arguments: cmd.arguments ?? {} }) });
          break;
        case 'close':
          await client.close();
          out({ id: cmd.id, ok: true });
          process.exit(0);
          break;
        default:
          out({ id: cmd.id, ok: false, status: null, code: null, message: `unknown op ${cmd.op}` });
      }
    } catch (err) {
      out({ id: cmd.id, ...failure(err) });
    }
  }
  await client.close();
  process.exit(0);
}

main().catch((err) => {
  out({ event: 'error', ...failure(err) });
  process.exit(1);
});
