// Browser test of the dashboard's chart when each line has one point, run by pkg/ui's
// TestOnePointChartShowsItsPoint: Debian's chromium driven by playwright-core (no browser
// download). The chart is judged by what it draws: the pixels of each line's colour in a
// screenshot of it.
//
// env: URL (a tether whose web service's history gives each line one point: 503 at the top,
// 429 lower), SCREENSHOT (PNG of the chart), CHROMIUM (default /usr/bin/chromium).
import { chromium } from 'playwright-core';

const env = (k, d) => process.env[k] ?? d;
const URL = env('URL');
const results = [];
const check = (name, ok, detail = '') => {
  results.push({ name, ok, detail });
  if (!ok) throw new Error(`${name}: ${detail}`);
};
const colors = { 429: [0xd8, 0x50, 0x3b], 503: [0x7a, 0x3b, 0xd8] }; // style.css and main.js

const browser = await chromium.launch({ executablePath: env('CHROMIUM', '/usr/bin/chromium'), headless: true, args: ['--no-sandbox'] });
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  await page.goto(URL + '/ui/');
  await page.waitForSelector('[data-service=web] svg.rates', { timeout: 10000 });
  const lines = await page.$$eval('[data-service=web] [data-line]', (ls) => Object.fromEntries(ls.map((l) => [l.dataset.line, l.getAttribute('points').trim().split(/\s+/).filter(Boolean).length])));
  check('each line has exactly one point (the case under test)', lines['429'] === 1 && lines['503'] === 1, JSON.stringify(lines));
  // The page renders anew with every snapshot (each second), so the chart is taken by its place
  // on the page rather than as an element.
  const size = await page.$eval('[data-service=web] svg.rates', (e) => { const r = e.getBoundingClientRect(); return { x: r.x, y: r.y, width: r.width, height: r.height }; });
  const png = await page.screenshot({ path: env('SCREENSHOT'), clip: size });

  // Each colour's pixel count and their centre, read back through a canvas on a blank page.
  const blank = await browser.newPage();
  const drawn = await blank.evaluate(async ({ b64, colors }) => {
    const img = new Image();
    img.src = 'data:image/png;base64,' + b64;
    await img.decode();
    const c = document.createElement('canvas');
    c.width = img.width; c.height = img.height;
    const g = c.getContext('2d');
    g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    const out = {};
    for (const [k, [r, gr, b]] of Object.entries(colors)) {
      let n = 0, sx = 0, sy = 0;
      for (let i = 0; i < d.length; i += 4) {
        if (Math.abs(d[i] - r) < 40 && Math.abs(d[i + 1] - gr) < 40 && Math.abs(d[i + 2] - b) < 40) {
          const p = i / 4;
          n++; sx += p % c.width; sy += Math.floor(p / c.width);
        }
      }
      out[k] = { n, x: n ? sx / n : -1, y: n ? sy / n : -1 };
    }
    return { ...out, width: c.width, height: c.height };
  }, { b64: png.toString('base64'), colors });
  const detail = JSON.stringify({ drawn, size });
  // A dot of radius 2.5 covers about 20 pixels; a one-point polyline draws none.
  check('the 503 point is drawn', drawn['503'].n >= 8, detail);
  check('the 429 point is drawn', drawn['429'].n >= 8, detail);
  // Both points are the latest rate: at the right edge; 503 (0.6/s, the maximum) above 429 (0.2/s).
  check('the points are at the right edge', drawn['503'].x > drawn.width * 0.9 && drawn['429'].x > drawn.width * 0.9, detail);
  check('503 (0.6/s) is drawn above 429 (0.2/s)', drawn['503'].y < drawn.height * 0.25 && drawn['429'].y > drawn['503'].y + drawn.height * 0.3, detail);
  check('the page runs with no errors', errors.length === 0, errors.slice(0, 3).join(' | '));
} finally {
  await browser.close();
  console.log(JSON.stringify(results));
}
