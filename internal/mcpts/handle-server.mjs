// A sessionless MCP replica built with the official TypeScript SDK 2.x server
// (@modelcontextprotocol/server, createMcpHandler: MCP 2026-07-28, with the SDK's stateless
// fallback for 2025-era clients), with the same handle tools as the Go replica
// (examples/mcp/replicas/mcpreplica Options.Handles):
//   whoami  -> {instance, session: ""}
//   open    -> mints "<name>:<random>", returns {handle, instance} and names the handle in the
//              Mcp-Handle response header
//   use     -> {instance, session: handle}; its "handle" argument is marked x-mcp-header
//              "Handle", so clients mirror it in Mcp-Param-Handle (and the SDK rejects a
//              tools/call whose header is missing or disagrees with the argument); a tool
//              error on a handle this replica did not mint
// Every response carries X-Instance: <name>. GET /log answers the requests received so far
// (not counting /log) as [{method, mcpMethod, mcpName, handle}].
//
// usage: node handle-server.mjs <name>   listens on 127.0.0.1 at a free port and prints
// {"port":N} once listening.
import http from 'node:http';
import { randomBytes } from 'node:crypto';
import { McpServer, createMcpHandler, fromJsonSchema } from '@modelcontextprotocol/server';

const name = process.argv[2] ?? 'ts';
const minted = new Set();
const log = [];
const mintHeader = 'x-replica-mint';

const result = (v) => ({ content: [{ type: 'text', text: JSON.stringify(v) }], structuredContent: v });

// factory builds the server for one HTTP request; the request's candidate handle comes from
// the HTTP layer below, which announces it if "open" minted it.
function factory(ctx) {
  const mint = ctx.requestInfo?.headers.get(mintHeader) ?? '';
  const s = new McpServer({ name, version: '1' });
  s.registerTool('whoami', { description: 'names the replica' }, async () => result({ instance: name, session: '' }));
  s.registerTool('open', { description: 'mints a handle for state kept on this replica' }, async () => {
    if (!mint) throw new Error('no handle to mint (not called over HTTP)');
    minted.add(mint);
    return result({ handle: mint, instance: name });
  });
  s.registerTool('use', {
    description: 'uses a handle minted by open',
    inputSchema: fromJsonSchema({
      type: 'object',
      properties: { handle: { type: 'string', 'x-mcp-header': 'Handle' } },
      required: ['handle'],
    }),
  }, async (args) => {
    if (!minted.has(args.handle)) {
      return { isError: true, content: [{ type: 'text', text: `replica ${name} never minted handle ${JSON.stringify(args.handle)}` }] };
    }
    return result({ instance: name, session: args.handle });
  });
  return s;
}

const handler = createMcpHandler(factory, { responseMode: 'json', onerror: (err) => process.stderr.write(`mcp: ${err?.message ?? err}\n`) });

const server = http.createServer(async (req, res) => {
  try {
    if (req.method === 'GET' && req.url === '/log') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(log));
      return;
    }
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const headers = new Headers();
    for (const [k, v] of Object.entries(req.headers)) {
      if (v !== undefined) headers.set(k, Array.isArray(v) ? v.join(', ') : v);
    }
    log.push({ method: req.method, mcpMethod: headers.get('mcp-method') ?? '', mcpName: headers.get('mcp-name') ?? '',
      handle: headers.get('mcp-param-handle') ?? '' });
    const cand = `${name}:${randomBytes(13).toString('hex').toUpperCase()}`;
    headers.set(mintHeader, cand);
    const ac = new AbortController();
    res.on('close', () => ac.abort());
    const hasBody = req.method !== 'GET' && req.method !== 'HEAD';
    const resp = await handler.fetch(new Request(`http://${req.headers.host ?? '127.0.0.1'}${req.url}`, {
      method: req.method, headers, body: hasBody ? Buffer.concat(chunks) : undefined, signal: ac.signal,
    }));
    const out = {};
    resp.headers.forEach((v, k) => { out[k] = v; });
    out['x-instance'] = name;
    if (minted.has(cand)) out['mcp-handle'] = cand;
    res.writeHead(resp.status, out);
    if (resp.body) {
      for await (const chunk of resp.body) res.write(chunk);
    }
    res.end();
  } catch (err) {
    process.stderr.write(`http: ${err?.stack ?? err}\n`);
    if (!res.headersSent) res.writeHead(500);
    res.end();
  }
});
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n');
});
