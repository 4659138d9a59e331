// Browser test of the dashboard, run by cmd/tether's TestDashboardInBrowser against real
// tethers: Debian's chromium driven by playwright-core (no browser download).
//
// env: OPEN_URL (a tether without tokens on loopback), AUTH_URL (a tether with tokens),
// STAR_TOKEN, WEB_TOKEN (a token for one service only), SCREENSHOT (PNG path),
// CHROMIUM (default /usr/bin/chromium).
import { chromium } from 'playwright-core';

const env = (k, d) => process.env[k] ?? d;
const OPEN = env('OPEN_URL'), AUTH = env('AUTH_URL');
const STAR = env('STAR_TOKEN'), WEB = env('WEB_TOKEN');
const results = [];
const check = (name, ok, detail = '') => {
  results.push({ name, ok, detail });
  if (!ok) throw new Error(`${name}: ${detail}`);
};

async function apiJSON(base, method, path, body, token) {
  const h = { 'Content-Type': 'application/json', 'X-Tether-Client': 'browser-test' };
  if (token) h.Authorization = 'Bearer ' + token;
  const r = await fetch(base + path, { method, headers: h, body: body ? JSON.stringify(body) : undefined });
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`);
  return r.json();
}

// shownSlots reads every instance card: {service/id: {sessions, requests, state}}.
const shownSlots = (page) => page.$$eval('[data-service] [data-instance]', (cards) => Object.fromEntries(cards.map((c) => [
  c.closest('[data-service]').dataset.service + '/' + c.dataset.instance,
  { sessions: c.querySelector('[data-kind=sessions]').textContent, requests: c.querySelector('[data-kind=requests]').textContent, state: c.dataset.state },
])));

const browser = await chromium.launch({ executablePath: env('CHROMIUM', '/usr/bin/chromium'), headless: true, args: ['--no-sandbox'] });
try {
  // Phase 1: loopback without tokens works as the API does.
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const consoleErrors = [];
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  const external = [];
  page.on('request', (r) => { if (!r.url().startsWith(OPEN)) external.push(r.url()); });
  await page.goto(OPEN + '/ui/');
  await page.waitForSelector('[data-service] [data-instance]', { timeout: 10000 });
  await page.waitForSelector('#live.on', { timeout: 5000 });

  const st = await apiJSON(OPEN, 'GET', '/v1/status');
  const want = {};
  for (const s of st.services) for (const i of s.instances) {
    want[s.name + '/' + i.id] = { sessions: `${i.sessions}/${i.sessionCapacity}`, requests: `${i.requests}/${i.requestCapacity}`, state: i.state.replace('INSTANCE_STATE_', '').toLowerCase() };
  }
  const shown = await shownSlots(page);
  check('slot numbers shown match the API', JSON.stringify(shown) === JSON.stringify(want), `shown ${JSON.stringify(shown)} api ${JSON.stringify(want)}`);
  const desired = await page.$eval('[data-service=web] [data-desired]', (e) => Number(e.textContent));
  check('desired instances shown match the API', desired === st.services.find((s) => s.name === 'web').desiredInstances, `shown ${desired}`);

  // A session created through the API shows within 2 s.
  const total = (o) => Object.values(o).reduce((n, v) => n + Number(v.sessions.split('/')[0]), 0);
  const before = total(shown);
  const t0 = Date.now();
  const created = await apiJSON(OPEN, 'POST', '/v1/services/web/sessions', {});
  await page.waitForFunction((n) => [...document.querySelectorAll('[data-service=web] [data-instance]')]
    .reduce((s, c) => s + Number(c.dataset.sessions), 0) === n, before + 1, { timeout: 2000 });
  check('updates within 2 s of a session created through the API', true, `${Date.now() - t0} ms`);

  // The sessions table follows the stream: the new session shows without a Search.
  await page.waitForSelector(`#sessions tbody tr[data-session="${created.id}"]`, { timeout: 5000 });
  check('the sessions table is live (a new session shows without Search)', true);
  // Times carry a date and a zone.
  const created1 = await page.$eval(`#sessions tbody tr[data-session="${created.id}"] td:nth-child(5)`, (td) => td.textContent);
  check('times show a date and a zone', new RegExp(String(new Date().getFullYear())).test(created1) && /(UTC|GMT|[A-Z]{3,4}|[+-]\d)/.test(created1.replace(/AM|PM/, '')), created1);
  // Actual is the API's (standby instances holding sessions included).
  const actual = await page.$eval('[data-service=web] [data-actual]', (e) => Number(e.textContent));
  check('actual instances shown match the API', actual === (await apiJSON(OPEN, 'GET', '/v1/status')).services.find((s) => s.name === 'web').actualInstances, `shown ${actual}`);
  // Buttons fit the state: an active instance offers Drain and Standby, never Undrain.
  const activeButtons = await page.$$eval('[data-service] [data-instance][data-state=active]', (cards) => cards.map((c) => [...c.querySelectorAll('button')].map((b) => b.dataset.action).join(',')));
  check('active instances offer drain and standby only', activeButtons.length > 0 && activeButtons.every((b) => b === 'drain,standby'), JSON.stringify(activeButtons));
  const rateText = await page.textContent('[data-service=web] .legend');
  check('the legend gives five-minute rates and the counts since start', /429\/s (\d+\.\d\d|–) · 503\/s (\d+\.\d\d|–) · 5-min rate · \d+ × 429, \d+ × 503 since start/.test(rateText), rateText);

  // Sessions table: search by id finds the created session alone.
  await page.fill('#s-id', created.id);
  await page.click('#session-search button[type=submit]');
  await page.waitForFunction((id) => {
    const rows = document.querySelectorAll('#sessions tbody tr');
    return rows.length === 1 && rows[0].dataset.session === id;
  }, created.id, { timeout: 5000 });
  check('sessions search by id', true);
  await page.fill('#s-id', '');
  await page.click('#session-search button[type=submit]');
  await page.waitForFunction((n) => document.querySelectorAll('#sessions tbody tr').length === n, before + 1, { timeout: 5000 });

  // Drain with a confirmation changes the instance's state (the page and the API agree).
  const target = created.instance;
  let asked = '';
  page.once('dialog', (d) => { asked = d.message(); d.accept(); });
  await page.click(`[data-service=web] [data-instance="${target}"] [data-action=drain]`);
  await page.waitForSelector(`[data-service=web] [data-instance="${target}"][data-state=draining]`, { timeout: 5000 });
  const drainingButtons = await page.$$eval(`[data-service=web] [data-instance="${target}"] button`, (bs) => bs.map((b) => b.dataset.action).join(','));
  check('a draining instance offers undrain and standby', drainingButtons === 'active,standby', drainingButtons);
  const inst = await apiJSON(OPEN, 'GET', `/v1/services/web/instances/${target}`);
  check('a drain action changes the instance state', asked.includes(target) && inst.state === 'INSTANCE_STATE_DRAINING', `dialog "${asked}", api ${inst.state}`);
  // A dismissed confirmation changes nothing.
  page.once('dialog', (d) => d.dismiss());
  await page.click(`[data-service=web] [data-instance="${target}"] [data-action=active]`);
  const still = await apiJSON(OPEN, 'GET', `/v1/services/web/instances/${target}`);
  check('a dismissed confirmation changes nothing', still.state === 'INSTANCE_STATE_DRAINING', still.state);

  await page.waitForTimeout(300); // let the last pushed snapshot paint before the picture
  await page.screenshot({ path: env('SCREENSHOT'), fullPage: true });
  check('page loads and runs with no console errors', consoleErrors.length === 0, consoleErrors.slice(0, 3).join(' | ').slice(0, 600));
  check('nothing fetched from another origin', external.length === 0, external.join(' '));

  // Phase 2: a tether with tokens refuses a wrong token, and a token for one service only.
  const p2 = await browser.newPage();
  await p2.goto(AUTH + '/ui/');
  await p2.waitForSelector('#error:not([hidden])', { timeout: 5000 });
  for (const [tok, code] of [['wrong-token', '401'], [WEB, '403']]) {
    await p2.fill('#token', tok);
    await p2.click('#auth button[type=submit]');
    await p2.waitForFunction((c) => document.querySelector('#error').textContent.includes(c) && !document.querySelector('#error').hidden, code, { timeout: 5000 });
    check(`a ${code === '401' ? 'wrong' : 'one-service'} token is refused (${code})`, true, await p2.textContent('#error'));
  }
  check('the token never appears in a URL', !p2.url().includes('token'), p2.url());
  await p2.fill('#token', STAR);
  await p2.click('#auth button[type=submit]');
  await p2.waitForSelector('[data-service] [data-instance]', { timeout: 5000 });
  const kept = await p2.evaluate(() => sessionStorage.getItem('tether.token'));
  check('the right token is kept in sessionStorage and works', kept === STAR && (await p2.isHidden('#error')));
} finally {
  await browser.close();
  console.log(JSON.stringify(results));
}
