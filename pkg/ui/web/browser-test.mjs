// Browser test of the dashboard, run by cmd/tether's TestDashboardInBrowser against real
// tethers: Debian's chromium driven by playwright-core (no browser download).
//
// env: OPEN_URL (a tether without tokens on loopback), AUTH_URL (a tether with tokens),
// STAR_TOKEN, WEB_TOKEN (a token for one service only), SCREENSHOT (PNG path),
// SCENE_URL (a tether whose web service has had traffic: sessions on two actives and on the
// standby, SCENE_NOCAPACITY requests refused 503 NoCapacity), SCENE_SCREENSHOT,
// CHROMIUM (default /usr/bin/chromium).
import { chromium } from 'playwright-core';

const env = (k, d) => process.env[k] ?? d;
const OPEN = env('OPEN_URL'), AUTH = env('AUTH_URL'), SCENE = env('SCENE_URL');
const NOCAP = Number(env('SCENE_NOCAPACITY', '0'));
const STAR = env('STAR_TOKEN'), WEB = env('WEB_TOKEN');
const results = [];
const SOFT = env('SOFT', '') !== ''; // record every failed check and go on (to show which fail on an old build)
const check = (name, ok, detail = '') => {
  results.push({ name, ok, detail });
  if (!ok && !SOFT) throw new Error(`${name}: ${detail}`);
};

async function apiJSON(base, method, path, body, token) {
  const h = { 'Content-Type': 'application/json', 'X-Tether-Client': 'browser-test' };
  if (token) h.Authorization = 'Bearer ' + token;
  const r = await fetch(base + path, { method, headers: h, body: body ? JSON.stringify(body) : undefined });
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`);
  return r.json();
}

// agree waits (up to 10 s) until what the page shows equals what the API says, then checks:
// the page follows a stream, so a value read at one instant may lag the API's on a loaded
// machine without being wrong.
async function agree(name, shownFn, apiFn) {
  const deadline = Date.now() + 10000;
  let shown, want;
  for (;;) {
    shown = JSON.stringify(await shownFn());
    want = JSON.stringify(await apiFn());
    if (shown === want || Date.now() > deadline) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  check(name, shown === want, `shown ${shown} api ${want}`);
  return JSON.parse(shown);
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

  const webStatus = async () => (await apiJSON(OPEN, 'GET', '/v1/status')).services.find((s) => s.name === 'web');
  const shown = await agree('slot numbers shown match the API', () => shownSlots(page), async () => {
    const want = {};
    for (const s of (await apiJSON(OPEN, 'GET', '/v1/status')).services) for (const i of s.instances) {
      want[s.name + '/' + i.id] = { sessions: `${i.sessions}/${i.sessionCapacity}`, requests: `${i.requests}/${i.requestCapacity}`, state: i.state.replace('INSTANCE_STATE_', '').toLowerCase() };
    }
    return want;
  });
  await agree('desired instances shown match the API', () => page.$eval('[data-service=web] [data-desired]', (e) => Number(e.textContent)),
    async () => (await webStatus()).desiredInstances);

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
  await agree('actual instances shown match the API', () => page.$eval('[data-service=web] [data-actual]', (e) => Number(e.textContent)),
    async () => (await webStatus()).actualInstances);
  // Buttons fit the state: an active instance offers Drain and Standby, never Undrain.
  const activeButtons = await page.$$eval('[data-service] [data-instance][data-state=active]', (cards) => cards.map((c) => [...c.querySelectorAll('button')].map((b) => b.dataset.action).join(',')));
  check('active instances offer drain and standby only', activeButtons.length > 0 && activeButtons.every((b) => b === 'drain,standby'), JSON.stringify(activeButtons));
  const rateText = await page.textContent('[data-service=web] .legend');
  check('the legend gives five-minute rates and the counts since start', /429\/s \d+\.\d{3} · 503\/s \d+\.\d{3} · 5-min rate · \d+ × 429, \d+ × 503 since start/.test(rateText), rateText);

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

  // Phase 3 (a tether that had traffic): a page opened now.
  const sp = await browser.newPage({ viewport: { width: 1280, height: 900 }, timezoneId: 'Europe/Berlin' });
  sp.on('pageerror', (e) => consoleErrors.push(String(e)));
  // The stream begins with the history (read here as the page reads it), whose last sample is
  // taken at connect: it holds the refusals at once, without waiting for a 10 s step.
  for (;;) {
    const ctl = new AbortController();
    const r = await fetch(SCENE + '/v1/status/stream', { headers: { Accept: 'text/event-stream' }, signal: ctl.signal });
    const rd = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    while (!buf.includes('\n\n')) buf += (await rd.read()).value || '';
    ctl.abort();
    const m = buf.match(/^event: history\ndata: (.*)$/m);
    const samples = m ? JSON.parse(m[1]).samples : [];
    // The last sample is taken at connect: it has the refusals even before the next 10 s step.
    if (samples.length && (samples[samples.length - 1].decisions?.web?.NoCapacity || 0) >= NOCAP) break;
    check('the status stream begins with the history, up to now', false, buf.slice(0, 300));
    break;
  }
  await sp.goto(SCENE + '/ui/');
  await sp.waitForSelector('[data-service=web] [data-instance]', { timeout: 10000 });
  // At the first paint: the 503 line has points and the legend is the 5-minute rate.
  const first = await sp.evaluate(() => ({
    line: document.querySelector('[data-service=web] [data-line="503"]')?.getAttribute('points') || '',
    r503: document.querySelector('[data-service=web] .r503').textContent,
  }));
  check('a fresh page charts the history at its first paint', first.line.trim().split(' ').filter(Boolean).length >= 1 && /,(?!40\.0)/.test(first.line), first.line);
  const r503 = Number(first.r503.match(/[\d.]+$/)?.[0] ?? first.r503.split(' ')[1]);
  // rate(...[5m]) of NOCAP refusals with the counter at 0 before them: NOCAP/300, plus at most
  // the extrapolation to the window's end (under 1.1 sample intervals).
  check('503/s is the 5-minute rate of the NoCapacity counter', r503 >= NOCAP / 300 - 0.0005 && r503 <= NOCAP / 300 * 1.5, first.r503);
  const sst = await apiJSON(SCENE, 'GET', '/v1/status');
  const web = sst.services.find((x) => x.name === 'web');
  const standby = web.instances.find((i) => i.state === 'INSTANCE_STATE_STANDBY');
  const sceneActual = await sp.$eval('[data-service=web] [data-actual]', (e) => Number(e.textContent));
  const activeN = web.instances.filter((i) => i.state === 'INSTANCE_STATE_ACTIVE').length;
  check('"actual" counts the standby holding sessions', standby.sessions > 0 && sceneActual === activeN + 1 && sceneActual === web.actualInstances,
    `shown ${sceneActual}, api ${web.actualInstances}, active ${activeN}, standby sessions ${standby.sessions}`);
  const buttons = await sp.$$eval('[data-service=web] [data-instance]', (cs) => Object.fromEntries(cs.map((c) => [c.dataset.state + ':' + c.dataset.instance, [...c.querySelectorAll('[data-action]')].map((b) => b.dataset.action).sort().join(',')])));
  const wrong = Object.entries(buttons).filter(([k, v]) => v !== { active: 'drain,standby', standby: 'active,drain' }[k.split(':')[0]]);
  check('buttons fit the state (no Undrain on active, no Standby on standby)', wrong.length === 0, JSON.stringify(buttons));
  // Times: date, time and the zone's offset, in the browser's zone (Europe/Berlin: +01:00 in winter).
  const list = await apiJSON(SCENE, 'GET', '/v1/services/web/sessions?limit=20');
  await sp.waitForSelector(`#sessions tbody tr[data-session="${list.sessions[0].id}"]`, { timeout: 5000 });
  const cell = await sp.$eval(`#sessions tbody tr[data-session="${list.sessions[0].id}"] td:nth-child(5)`, (e) => e.textContent);
  const m = cell.match(/^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d) ([+-]\d\d:\d\d)$/);
  const created0 = Math.floor(Date.parse(list.sessions[0].createTime) / 1000) * 1000;
  const berlin = (ms) => new Intl.DateTimeFormat('en', { timeZone: 'Europe/Berlin', timeZoneName: 'longOffset' })
    .formatToParts(new Date(ms)).find((x) => x.type === 'timeZoneName').value.replace('GMT', '') || '+00:00';
  check('times show date and zone', !!m && Date.parse(`${m[1]}T${m[2]}${m[3]}`) === created0 && m[3] === berlin(created0), `${cell} for ${list.sessions[0].createTime}`);
  await sp.screenshot({ path: env('SCENE_SCREENSHOT'), fullPage: true });
  check('the scene page runs with no errors', consoleErrors.length === 0, consoleErrors.slice(0, 3).join(' | ').slice(0, 600));

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
