// Records the SHA-256 of the dashboard's sources in ../dist/SOURCES.sha256 after a build, so
// that a Go test (pkg/ui) can tell committed assets that no longer match their sources.
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

export const sources = () => ['index.html', 'vite.config.js', 'package.json', 'package-lock.json',
  ...readdirSync('src').sort().map((f) => join('src', f))];

const h = createHash('sha256');
for (const f of sources()) {
  h.update(f + '\0');
  h.update(readFileSync(f));
  h.update('\0');
}
writeFileSync('../dist/SOURCES.sha256', h.digest('hex') + '\n');
