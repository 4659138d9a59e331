// Browser attacks on a token-less loopback API, run by cmd/tether's TestBrowserCannotDriveTheAPI
// against a real tether in Debian's chromium through playwright-core (issue 25, finding 1). It
// only attacks and reports what the browser saw, as one JSON line on stdout; the Go test checks
// through the API what the attacks changed.
//
//  1. Cross-site request forgery: a page served from another origin (a second loopback port)
//     sends fetch(…, {mode: 'no-cors'}) with text/plain bodies — the requests a page may send
//     without a preflight — to drain instance DRAIN_ID and register instance "evil-1".
//  2. DNS rebinding: the name attacker.example resolves to 127.0.0.1 (Chromium's
//     --host-resolver-rules stands in for an attacker's DNS answer changing), so a page at
//     http://attacker.example:PORT is same-origin with the API and may send any header: it
//     reads /v1/status and sets instance STANDBY_ID's state to standby.
//
// env: API_URL (http://127.0.0.1:PORT), DRAIN_ID, STANDBY_ID, CHROMIUM (default /usr/bin/chromium).
import http from 'node:http';
import { chromium } from 'playwright-core';

const API = process.env.API_URL;
const port = new URL(API).port;
const drainID = process.env.DRAIN_ID, standbyID = process.env.STANDBY_ID;

const attackPage = `<!doctype html><meta charset="utf-8"><title>cat pictures</title><script>
(async () => {
  const api = ${JSON.stringify(API)};
  const opts = (body) => ({ method: 'POST', mode: 'no-cors', headers: { 'Content-Type': 'text/plain' }, body });
  const sent = [];
  try { await fetch(api + '/v1/services/web/instances/${drainID}/drain', opts('{}')); sent.push('drain'); } catch (e) { sent.push('drain: ' + e); }
  try { await fetch(api + '/v1/services/web/instances', opts(JSON.stringify({ id: 'evil-1', address: '127.0.0.1', httpPort: 9 }))); sent.push('register'); } catch (e) { sent.push('register: ' + e); }
  window.attackDone = sent;
})();
</script>`;

const site = http.createServer((req, res) => {
  res.writeHead(200, { 'Content-Type': 'text/html' });
  res.end(attackPage);
});
await new Promise((ok) => site.listen(0, '127.0.0.1', ok));
const siteURL = `http://127.0.0.1:${site.address().port}/`;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--host-resolver-rules=MAP attacker.example 127.0.0.1'],
});
const out = {};
try {
  const csrf = await browser.newPage();
  await csrf.goto(siteURL);
  await csrf.waitForFunction(() => window.attackDone, null, { timeout: 20000 });
  out.csrf = { origin: siteURL, sent: await csrf.evaluate(() => window.attackDone) };

  const rebind = await browser.newPage();
  const nav = await rebind.goto(`http://attacker.example:${port}/v1/status`);
  out.rebinding = await rebind.evaluate(async (standby) => {
    const r = {};
    const st = await fetch('/v1/status');
    const text = await st.text();
    r.statusCode = st.status;
    r.readServices = text.includes('"services"');
    const put = await fetch(`/v1/services/web/instances/${standby}/state`, {
      method: 'PUT', headers: { 'Content-Type': 'application/json', 'X-Tether-Client': 'page' },
      body: JSON.stringify({ state: 'standby' }),
    });
    r.putStatus = put.status;
    const ev = await fetch('/v1/status/stream');
    r.streamStatus = ev.status;
    if (ev.body) await ev.body.cancel();
    return r;
  }, standbyID);
  out.rebinding.navigationStatus = nav.status();
} finally {
  await browser.close();
  site.close();
}
console.log(JSON.stringify(out));
