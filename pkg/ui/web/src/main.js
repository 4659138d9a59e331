// tether's operator dashboard: renders the /v1/status snapshot pushed over server-sent events
// (read with fetch so that the token travels in the Authorization header, never in a URL),
// pages through sessions, and drains or sets instances' state with a confirmation.
import './style.css';

const TOKEN_KEY = 'tether.token';
const RATE_WINDOW_MS = 5 * 60 * 1000; // the 429/503 chart shows the last five minutes
const $ = (sel) => document.querySelector(sel);

let token = sessionStorage.getItem(TOKEN_KEY) || '';
let stream = null; // AbortController of the status stream
let last = null; // last snapshot
const history = new Map(); // service -> [{t, tooMany, noCap}] cumulative counts

// Every call says it comes from tether's own dashboard: the API refuses a state-changing call
// without a token unless it carries X-Tether-Client (a page on another origin cannot send it).
function headers(extra = {}) {
  const h = { 'X-Tether-Client': 'dashboard', ...extra };
  if (token) h.Authorization = 'Bearer ' + token;
  return h;
}

function showError(msg) {
  const e = $('#error');
  e.textContent = msg;
  e.hidden = !msg;
}

async function api(method, path, body) {
  const res = await fetch(path, {
    method,
    headers: headers(body ? { 'Content-Type': 'application/json' } : {}),
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  let data = {};
  try { data = text ? JSON.parse(text) : {}; } catch { data = { errorMessage: text }; }
  if (!res.ok) {
    const err = new Error(`${res.status} ${data.errorCode || res.statusText}: ${data.errorMessage || ''}`.trim());
    err.status = res.status;
    throw err;
  }
  return data;
}

function refused(status, msg) {
  setLive(false);
  if (status === 401) showError('Token refused (401): ' + msg + '. Type a valid token above.');
  else if (status === 403) showError('Token not allowed (403): ' + msg + '. The dashboard needs a token for every service ("*").');
  else showError(msg);
}

function setLive(on) {
  const l = $('#live');
  l.textContent = on ? 'live' : 'offline';
  l.classList.toggle('on', on);
}

// connect reads the SSE stream until it ends, then reconnects (unless refused).
async function connect() {
  if (stream) stream.abort();
  const ctl = new AbortController();
  stream = ctl;
  try {
    const res = await fetch('/v1/status/stream', { headers: headers({ Accept: 'text/event-stream' }), signal: ctl.signal });
    if (!res.ok) {
      let msg = res.statusText;
      try { msg = (await res.json()).errorMessage || msg; } catch { /* not JSON */ }
      refused(res.status, msg);
      return;
    }
    showError('');
    setLive(true);
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = block.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
        if (data) render(JSON.parse(data));
      }
    }
  } catch (e) {
    if (ctl.signal.aborted) return;
    showError('Status stream: ' + e.message);
  }
  if (stream === ctl) {
    setLive(false);
    setTimeout(connect, 2000);
  }
}

const word = (v, prefix) => String(v || '').replace(prefix, '').toLowerCase().replaceAll('_', '-');
// Times carry their date and zone (a table of sessions spans days; operators compare with logs).
const when = (ts) => (ts ? new Date(ts).toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'long' }) : '-');

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

function bar(label, used, cap, kind) {
  const pct = cap > 0 ? Math.min(100, (100 * used) / cap) : 0;
  return el('div', { class: 'slot ' + kind },
    el('div', { class: 'label' }, el('span', { text: label }), el('span', { class: 'value', 'data-kind': kind, text: `${used}/${cap}` })),
    el('div', { class: 'bar' + (pct >= 90 ? ' full' : '') }, fill(pct)));
}

// fill is a bar's filled part; its width is set through the CSSOM, which the page's
// Content-Security-Policy (no inline styles) allows.
function fill(pct) {
  const d = document.createElement('div');
  d.style.width = pct + '%';
  return d;
}

function record(svc, now) {
  const d = svc.decisions || {};
  const h = history.get(svc.name) || [];
  h.push({ t: now, tooMany: Number(d.TooManyRequests || 0), noCap: Number(d.NoCapacity || 0) });
  while (h.length > 2 && now - h[0].t > RATE_WINDOW_MS) h.shift();
  history.set(svc.name, h);
  return h;
}

// rate5m is what Prometheus's rate(x[5m]) would say at the last snapshot: the counter's
// increase over the samples inside the last five minutes divided by the time they span
// (a counter reset counts from zero). null until two samples exist.
function rate5m(h, key) {
  if (h.length < 2) return null;
  const end = h[h.length - 1].t;
  const win = h.filter((x) => end - x.t <= RATE_WINDOW_MS);
  if (win.length < 2) return null;
  let inc = 0;
  for (let i = 1; i < win.length; i++) {
    const d = win[i][key] - win[i - 1][key];
    inc += d >= 0 ? d : win[i][key];
  }
  return inc / Math.max(0.001, (win[win.length - 1].t - win[0].t) / 1000);
}

// chart draws the 429 and 503 rates (per second, between consecutive snapshots) as lines; the
// legend gives the five-minute rates (rate5m).
function chart(h) {
  const w = 240, ht = 40;
  const pts429 = [], pts503 = [];
  let maxRate = 0.0001;
  const rates = [];
  for (let i = 1; i < h.length; i++) {
    const dt = Math.max(0.001, (h[i].t - h[i - 1].t) / 1000);
    const r = { t: h[i].t, a: Math.max(0, h[i].tooMany - h[i - 1].tooMany) / dt, b: Math.max(0, h[i].noCap - h[i - 1].noCap) / dt };
    rates.push(r);
    maxRate = Math.max(maxRate, r.a, r.b);
  }
  const t0 = h.length ? h[h.length - 1].t - RATE_WINDOW_MS : 0;
  for (const r of rates) {
    const x = ((r.t - t0) / RATE_WINDOW_MS) * w;
    pts429.push(`${x.toFixed(1)},${(ht - (r.a / maxRate) * (ht - 2)).toFixed(1)}`);
    pts503.push(`${x.toFixed(1)},${(ht - (r.b / maxRate) * (ht - 2)).toFixed(1)}`);
  }
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'rates');
  svg.setAttribute('width', w);
  svg.setAttribute('height', ht);
  svg.setAttribute('viewBox', `0 0 ${w} ${ht}`);
  const bg = document.createElementNS(ns, 'rect');
  bg.setAttribute('width', w); bg.setAttribute('height', ht); bg.setAttribute('fill', '#f7f9fb');
  svg.append(bg);
  for (const [pts, color] of [[pts429, '#d8503b'], [pts503, '#7a3bd8']]) {
    const p = document.createElementNS(ns, 'polyline');
    p.setAttribute('points', pts.join(' '));
    p.setAttribute('fill', 'none');
    p.setAttribute('stroke', color);
    p.setAttribute('stroke-width', '1.5');
    svg.append(p);
  }
  const fmt = (r) => (r === null ? '–' : r.toFixed(2));
  const r429 = rate5m(h, 'tooMany'), r503 = rate5m(h, 'noCap');
  const last = h[h.length - 1] || { tooMany: 0, noCap: 0 };
  return el('div', { class: 'chart' }, svg,
    el('div', { class: 'legend' },
      el('span', { class: 'r429', 'data-rate': '429', text: `429/s ${fmt(r429)}` }), ' · ',
      el('span', { class: 'r503', 'data-rate': '503', text: `503/s ${fmt(r503)}` }),
      ` · 5-min rate · ${last.tooMany} × 429, ${last.noCap} × 503 since start`));
}

// actions are the state changes that make sense from state: no Undrain on an active instance.
function actions(state) {
  switch (state) {
    case 'draining': return [['active', 'Undrain'], ['standby', 'Standby']];
    case 'standby': return [['active', 'Activate'], ['drain', 'Drain']];
    default: return [['drain', 'Drain'], ['standby', 'Standby']];
  }
}

async function act(service, id, what) {
  const verbs = { drain: 'drain', active: 'set active', standby: 'set standby' };
  if (!window.confirm(`${verbs[what]} instance ${service}/${id}?`)) return;
  try {
    const base = `/v1/services/${encodeURIComponent(service)}/instances/${encodeURIComponent(id)}`;
    if (what === 'drain') await api('POST', base + '/drain', { timeout: '0s' });
    else await api('PUT', base + '/state', { state: what });
    showError('');
  } catch (e) {
    if (e.status === 401 || e.status === 403) refused(e.status, e.message);
    else showError(`${verbs[what]} ${service}/${id}: ${e.message}`);
  }
}

function render(st) {
  last = st;
  const now = Date.now();
  const root = $('#services');
  root.replaceChildren();
  for (const svc of st.services || []) {
    const h = record(svc, now);
    const insts = el('div', { class: 'instances' });
    for (const i of svc.instances || []) {
      const state = word(i.state, 'INSTANCE_STATE_');
      const health = word(i.health, 'INSTANCE_HEALTH_');
      insts.append(el('div', {
        class: 'instance', 'data-instance': i.id, 'data-state': state, 'data-health': health,
        'data-sessions': i.sessions, 'data-requests': i.requests,
      },
      el('div', {}, el('span', { class: 'name', text: i.id }),
        el('span', { class: 'badge ' + state, text: state }), el('span', { class: 'badge ' + health, text: health }),
        el('span', { class: 'badge', text: 'w' + i.weight })),
      bar('session slots', i.sessions, i.sessionCapacity, 'sessions'),
      bar('request slots', i.requests, i.requestCapacity, 'requests'),
      el('div', { class: 'actions' }, ...actions(state).map(([what, label]) =>
        el('button', { type: 'button', 'data-action': what, onclick: () => act(svc.name, i.id, what), text: label })))));
    }
    root.append(el('section', { class: 'service', 'data-service': svc.name },
      el('h2', { text: svc.name }),
      el('div', { class: 'meta' },
        `affinity ${svc.affinity} · desired `, el('b', { 'data-desired': '', text: svc.desiredInstances }),
        ' vs actual ', el('b', { 'data-actual': '', text: svc.actualInstances }), ' instances'),
      chart(h), insts));
  }
  const sel = $('#s-service');
  const names = (st.services || []).map((s) => s.name);
  if (sel.options.length !== names.length || names.some((n, k) => sel.options[k].value !== n)) {
    const cur = sel.value;
    sel.replaceChildren(...names.map((n) => el('option', { value: n, text: n })));
    if (names.includes(cur)) sel.value = cur;
    if (!pages.loaded) loadSessions();
  }
  // The sessions table follows the stream: the page shown is reloaded when any instance's
  // sessions changed (at most one load in flight; one more after it if it changed meanwhile).
  const sig = (st.services || []).map((s) => s.name + ':' + (s.instances || []).map((i) => i.id + '=' + i.sessions).join(',')).join(';');
  if (pages.loaded && sig !== pages.sig) {
    pages.sig = sig;
    refreshSessions();
  }
  const x = st.xds;
  $('#xds-summary').textContent = x
    ? `generation ${x.generation} · ${x.publishes} publishes · ${x.nacks} NACKs · publish ${x.lastError ? 'FAILING: ' + x.lastError : 'ok'}`
    : 'xDS is off';
  $('#xds tbody').replaceChildren(...((x && x.nodes) || []).map((n) => el('tr', { 'data-node': n.id },
    el('td', { text: n.id }), el('td', { text: n.snapshot }), el('td', { text: n.streams }),
    el('td', { text: when(n.lastAck) }),
    el('td', { text: n.lastNack ? `${when(n.lastNack.time)} ${n.lastNack.message}` : '-' }))));
  $('#events tbody').replaceChildren(...(st.events || []).slice(-20).reverse().map((e) => el('tr', {},
    el('td', { text: when(e.time) }), el('td', { text: word(e.kind, 'SCALE_EVENT_KIND_') }),
    el('td', { text: e.service }), el('td', { text: e.instance }), el('td', { text: e.desiredInstances }))));
}

// Sessions: server-side filters and paging (page tokens kept for Previous).
const pages = { tokens: [''], index: 0, next: '', loaded: false, sig: '', busy: null, again: false };

function refreshSessions() {
  if (pages.busy) { pages.again = true; return; }
  pages.busy = loadSessions().finally(() => {
    pages.busy = null;
    if (pages.again) { pages.again = false; refreshSessions(); }
  });
}

async function loadSessions() {
  const service = $('#s-service').value;
  if (!service) return;
  pages.loaded = true;
  const q = new URLSearchParams({ limit: '20' });
  for (const [k, sel] of [['id', '#s-id'], ['instance', '#s-instance'], ['status', '#s-status']]) {
    const v = $(sel).value.trim();
    if (v) q.set(k, v);
  }
  const tok = pages.tokens[pages.index];
  if (tok) q.set('pageToken', tok);
  try {
    const res = await api('GET', `/v1/services/${encodeURIComponent(service)}/sessions?${q}`);
    pages.next = res.nextPageToken || '';
    $('#sessions tbody').replaceChildren(...(res.sessions || []).map((s) => el('tr', { 'data-session': s.id },
      el('td', { text: s.id }), el('td', { text: s.instance }), el('td', { text: word(s.status, 'SESSION_STATUS_') }),
      el('td', { text: word(s.affinityKind, 'AFFINITY_KIND_') }), el('td', { text: when(s.createTime) }),
      el('td', { text: when(s.lastSeenTime) }), el('td', { text: when(s.expireTime) }))));
    $('#page').textContent = `page ${pages.index + 1}`;
    $('#prev').disabled = pages.index === 0;
    $('#next').disabled = !pages.next;
  } catch (e) {
    if (e.status === 401 || e.status === 403) refused(e.status, e.message);
    else if (e.status === 400) $('#sessions tbody').replaceChildren(el('tr', {}, el('td', { colspan: 7, text: e.message })));
    else showError('Sessions: ' + e.message);
  }
}

$('#session-search').addEventListener('submit', (ev) => {
  ev.preventDefault();
  pages.tokens = [''];
  pages.index = 0;
  loadSessions();
});
$('#s-service').addEventListener('change', () => { pages.tokens = ['']; pages.index = 0; loadSessions(); });
$('#next').addEventListener('click', () => {
  if (!pages.next) return;
  pages.tokens = pages.tokens.slice(0, pages.index + 1).concat(pages.next);
  pages.index++;
  loadSessions();
});
$('#prev').addEventListener('click', () => {
  if (pages.index === 0) return;
  pages.index--;
  loadSessions();
});
$('#auth').addEventListener('submit', (ev) => {
  ev.preventDefault();
  token = $('#token').value.trim();
  $('#token').value = '';
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  pages.loaded = false;
  connect();
});
$('#forget').addEventListener('click', () => {
  token = '';
  sessionStorage.removeItem(TOKEN_KEY);
  connect();
});

connect();
