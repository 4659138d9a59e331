// tether's operator dashboard: renders the /v1/status snapshot pushed over server-sent events
// (read with fetch so that the token travels in the Authorization header, never in a URL),
// pages through sessions, and drains or sets instances' state with a confirmation.
import './style.css';

const TOKEN_KEY = 'tether.token';
const RATE_WINDOW_MS = 5 * 60 * 1000; // the 429/503 rates and chart cover the last five minutes
const CHART_STEP_MS = 10 * 1000; // the chart plots one rate per 10 s (the server's history step)
const $ = (sel) => document.querySelector(sel);

let token = sessionStorage.getItem(TOKEN_KEY) || '';
let stream = null; // AbortController of the status stream
let last = null; // last snapshot
const history = new Map(); // service -> [{t, tooMany, noCap}] cumulative counts, oldest first, by server time

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
        const lines = block.split('\n');
        const ev = (lines.find((l) => l.startsWith('event: ')) || 'event: status').slice(7);
        const data = lines.filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
        if (!data) continue;
        if (ev === 'history') loadHistory(JSON.parse(data));
        else render(JSON.parse(data));
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
// when shows a time with its date and zone offset, in the browser's zone: 2026-12-01 23:02:25 +01:00.
const two = (n) => String(n).padStart(2, '0');
function when(ts) {
  if (!ts) return '-';
  const d = new Date(ts);
  const off = -d.getTimezoneOffset();
  const zone = `${off < 0 ? '-' : '+'}${two(Math.floor(Math.abs(off) / 60))}:${two(Math.abs(off) % 60)}`;
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())} ${zone}`;
}

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

// add appends one sample of a service's counters, keeping the rate window (and one sample
// before it, for the chart's first step).
function add(name, t, tooMany, noCap) {
  const h = history.get(name) || [];
  if (h.length && t <= h[h.length - 1].t) return h; // already have it (history and stream overlap)
  h.push({ t, tooMany, noCap });
  while (h.length > 2 && t - h[1].t > RATE_WINDOW_MS) h.shift();
  history.set(name, h);
  return h;
}

// loadHistory takes the server's history event (sent first on every stream): the last five
// minutes' counters, so that the chart and the rates are whole from the first paint.
function loadHistory(ev) {
  history.clear();
  // A service missing from a sample had no decisions yet: the counters start at 0 with tether,
  // and the history is tether's own since its start.
  const names = new Set((ev.samples || []).flatMap((smp) => Object.keys(smp.decisions || {})));
  for (const smp of ev.samples || []) {
    const t = Date.parse(smp.time);
    for (const name of names) {
      const d = (smp.decisions || {})[name] || {};
      add(name, t, Number(d.TooManyRequests || 0), Number(d.NoCapacity || 0));
    }
  }
}

function record(svc, t) {
  const d = svc.decisions || {};
  return add(svc.name, t, Number(d.TooManyRequests || 0), Number(d.NoCapacity || 0));
}

// rate is Prometheus's rate() of one counter over the range ending at end (ms): the increase
// between the first and last samples in (end - range, end], counter resets added back,
// extrapolated to the range's edges as Prometheus does (at most to where the counter would
// have been zero, and only when the gap is under 1.1 average sample intervals), per second.
function rate(samples, key, end, range) {
  const start = end - range;
  const s = samples.filter((x) => x.t > start && x.t <= end);
  if (s.length < 2) return 0;
  const first = s[0], lastS = s[s.length - 1];
  let inc = lastS[key] - first[key];
  for (let i = 1; i < s.length; i++) if (s[i][key] < s[i - 1][key]) inc += s[i - 1][key];
  const sampled = (lastS.t - first.t) / 1000;
  if (sampled <= 0) return 0;
  const avg = sampled / (s.length - 1);
  let toStart = (first.t - start) / 1000;
  const toEnd = (end - lastS.t) / 1000;
  if (inc > 0 && first[key] >= 0) toStart = Math.min(toStart, sampled * (first[key] / inc));
  const threshold = avg * 1.1;
  const span = sampled + (toStart < threshold ? toStart : avg / 2) + (toEnd < threshold ? toEnd : avg / 2);
  return (inc * (span / sampled)) / (range / 1000);
}

// chart draws the 429 and 503 rates per 10 s step over the last five minutes as lines (a dot
// when there is one point), and the five-minute rates (as Prometheus's rate(...[5m]) would
// give them) in the legend.
function chart(h) {
  const w = 240, ht = 40;
  const pts429 = [], pts503 = [];
  let maxRate = 0.0001;
  const rates = [];
  const end = h.length ? h[h.length - 1].t : 0;
  let prev = h[0];
  for (let i = 1; i < h.length; i++) {
    if (h[i].t - prev.t < CHART_STEP_MS && i !== h.length - 1) continue;
    const dt = Math.max(0.001, (h[i].t - prev.t) / 1000);
    const r = { t: h[i].t, a: Math.max(0, h[i].tooMany - prev.tooMany) / dt, b: Math.max(0, h[i].noCap - prev.noCap) / dt };
    prev = h[i];
    rates.push(r);
    maxRate = Math.max(maxRate, r.a, r.b);
  }
  const t0 = end - RATE_WINDOW_MS;
  for (const r of rates) {
    const x = Math.max(0, ((r.t - t0) / RATE_WINDOW_MS) * w);
    pts429.push([x, ht - (r.a / maxRate) * (ht - 2)]);
    pts503.push([x, ht - (r.b / maxRate) * (ht - 2)]);
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
  for (const [pts, color, kind] of [[pts429, '#d8503b', '429'], [pts503, '#7a3bd8', '503']]) {
    const p = document.createElementNS(ns, 'polyline');
    p.setAttribute('points', pts.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(' '));
    p.setAttribute('fill', 'none');
    p.setAttribute('stroke', color);
    p.setAttribute('stroke-width', '1.5');
    p.setAttribute('data-line', kind);
    svg.append(p);
    // A line of one point draws nothing (a fresh tether, or a page opened within a step of the
    // history's last sample): that point is a dot, kept whole inside the chart's edges.
    if (pts.length === 1) {
      const [x, y] = pts[0], r = 2.5;
      const dot = document.createElementNS(ns, 'circle');
      dot.setAttribute('cx', Math.min(w - r, Math.max(r, x)).toFixed(1));
      dot.setAttribute('cy', Math.min(ht - r, Math.max(r, y)).toFixed(1));
      dot.setAttribute('r', r);
      dot.setAttribute('fill', color);
      dot.setAttribute('data-point', kind);
      svg.append(dot);
    }
  }
  const r429 = rate(h, 'tooMany', end, RATE_WINDOW_MS), r503 = rate(h, 'noCap', end, RATE_WINDOW_MS);
  const lastS = h[h.length - 1] || { tooMany: 0, noCap: 0 };
  return el('div', { class: 'chart' }, svg,
    el('div', { class: 'legend' },
      el('span', { class: 'r429', 'data-rate': '429', text: `429/s ${r429.toFixed(3)}` }), ' · ',
      el('span', { class: 'r503', 'data-rate': '503', text: `503/s ${r503.toFixed(3)}` }),
      ` · 5-min rate · ${lastS.tooMany} × 429, ${lastS.noCap} × 503 since start`));
}

async function act(service, id, what) {
  const verbs = { drain: 'drain', active: 'undrain (set active)', standby: 'set standby' };
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

// actions are the buttons that change an instance's state from this one: no Undrain on an
// active instance, no Standby on a standby one, no Drain on a draining one.
function actions(state) {
  return {
    active: [['drain', 'Drain'], ['standby', 'Standby']],
    standby: [['active', 'Activate'], ['drain', 'Drain']],
    draining: [['active', 'Undrain'], ['standby', 'Standby']],
  }[state] || [['drain', 'Drain'], ['active', 'Activate'], ['standby', 'Standby']];
}

function render(st) {
  last = st;
  const now = st.time ? Date.parse(st.time) : Date.now();
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
  // The sessions table follows the stream: the page shown is read again with each snapshot
  // (one request at a time, with the filters of the last Search).
  if (pages.loaded && !pages.busy) loadSessions();
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
const pages = { tokens: [''], index: 0, next: '', loaded: false, busy: false, filters: {}, seq: 0 };

async function loadSessions() {
  const service = $('#s-service').value;
  if (!service) return;
  pages.loaded = true;
  pages.busy = true;
  const seq = ++pages.seq; // a reply to an older request (older filters or page) is dropped
  const q = new URLSearchParams({ limit: '20' });
  for (const [k, v] of Object.entries(pages.filters)) if (v) q.set(k, v);
  const tok = pages.tokens[pages.index];
  if (tok) q.set('pageToken', tok);
  try {
    const res = await api('GET', `/v1/services/${encodeURIComponent(service)}/sessions?${q}`);
    if (seq !== pages.seq) return;
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
  } finally {
    if (seq === pages.seq) pages.busy = false;
  }
}

// applyFilters takes the search form's filters (they apply from Search on, also to the
// table's live refresh).
function applyFilters() {
  pages.filters = {};
  for (const [k, sel] of [['id', '#s-id'], ['instance', '#s-instance'], ['status', '#s-status']]) pages.filters[k] = $(sel).value.trim();
}

$('#session-search').addEventListener('submit', (ev) => {
  ev.preventDefault();
  pages.tokens = [''];
  pages.index = 0;
  applyFilters();
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
