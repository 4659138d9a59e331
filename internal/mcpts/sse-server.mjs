// A TypeScript-SDK MCP server speaking HTTP+SSE (2024-11-05) the TS way: GET /sse opens the
// stream and announces "/messages?sessionId=<uuid>"; POST /messages?sessionId=... carries
// client messages. Used by tether's tests as a real replica with TS-style session parameters.
//
// usage: node sse-server.mjs <name>   — listens on 127.0.0.1 at a free port and prints
// {"event":"listening","port":N} on stdout.
import http from 'node:http';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { SSEServerTransport } from '@modelcontextprotocol/sdk/server/sse.js';

const name = process.argv[2] ?? 'ts';
const transports = new Map();

function newServer() {
  const server = new McpServer({ name, version: '1' });
  server.registerTool('whoami', { description: 'names the replica and session' }, async (extra) => {
    const result = { instance: name, session: extra.sessionId ?? '', roots: 0 };
    return { content: [{ type: 'text', text: JSON.stringify(result) }], structuredContent: result };
  });
  server.registerTool('roots', { description: 'asks the client for its roots' }, async (extra) => {
    const res = await server.server.listRoots();
    const result = { instance: name, session: extra.sessionId ?? '', roots: res.roots.length };
    return { content: [{ type: 'text', text: JSON.stringify(result) }], structuredContent: result };
  });
  return server;
}

const httpServer = http.createServer(async (req, res) => {
  res.setHeader('X-Instance', name);
  const url = new URL(req.url, 'http://localhost');
  if (req.method === 'GET' && url.pathname === '/sse') {
    const transport = new SSEServerTransport('/messages', res);
    transports.set(transport.sessionId, transport);
    res.on('close', () => transports.delete(transport.sessionId));
    await newServer().connect(transport);
    return;
  }
  if (req.method === 'POST' && url.pathname === '/messages') {
    const t = transports.get(url.searchParams.get('sessionId') ?? '');
    if (!t) {
      res.writeHead(404).end('Could not find session');
      return;
    }
    await t.handlePostMessage(req, res);
    return;
  }
  if (url.pathname === '/healthz') {
    res.writeHead(200).end('ok');
    return;
  }
  res.writeHead(404).end('not found');
});

httpServer.listen(0, '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ event: 'listening', port: httpServer.address().port }) + '\n');
});
process.on('SIGTERM', () => process.exit(0));
